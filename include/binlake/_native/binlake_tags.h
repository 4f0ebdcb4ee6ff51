/*
 * binlake_tags.h - the protobuf tags (field number << 3 | wire type) of the
 * binlog.proto fields binlake's C extensions read or write by hand (and the
 * one enum value they need), one place for all of them.
 *
 * A tag is named BL_TAG_ + its message's name in upper snake case + _ + the
 * field's name in upper case, an enum value BL_ + the enum's name + _ + the
 * value's, and the comment after it names the field or value:
 * tests/unit/test_native_tags.py reads every #define of this file and checks
 * name and value against the descriptors of binlake.proto.binlog_pb2, so a
 * change to binlog.proto that moves one of these fails there rather than
 * writing bytes the protobuf parser reads differently.
 *
 * Wire types: 0 varint, 1 fixed64, 2 length-delimited.
 */
#ifndef BINLAKE_TAGS_H
#define BINLAKE_TAGS_H

/* Datum: one field of its oneof. */
#define BL_TAG_DATUM_IS_NULL 0x08         /* Datum.is_null */
#define BL_TAG_DATUM_INT_VALUE 0x10       /* Datum.int_value */
#define BL_TAG_DATUM_UINT_VALUE 0x18      /* Datum.uint_value */
#define BL_TAG_DATUM_FLOAT_VALUE 0x21     /* Datum.float_value */
#define BL_TAG_DATUM_DECIMAL_VALUE 0x2A   /* Datum.decimal_value */
#define BL_TAG_DATUM_STRING_VALUE 0x32    /* Datum.string_value */
#define BL_TAG_DATUM_BYTES_VALUE 0x3A     /* Datum.bytes_value */
#define BL_TAG_DATUM_DATE_MICROS 0x40     /* Datum.date_micros */
#define BL_TAG_DATUM_DATETIME_MICROS 0x48 /* Datum.datetime_micros */
#define BL_TAG_DATUM_TIME_MICROS 0x50     /* Datum.time_micros */
#define BL_TAG_DATUM_JSON_VALUE 0x5A      /* Datum.json_value */

/* A Row is a list of Columns (read by the lake as the map<int64, bytes> of the same wire shape). */
#define BL_TAG_COLUMN_ID 0x08             /* Column.id */
#define BL_TAG_COLUMN_VALUE 0x12          /* Column.value */
#define BL_TAG_ROW_COLUMNS 0x0A           /* Row.columns */
#define BL_TAG_UPDATED_ROW_OLD 0x0A       /* UpdatedRow.old */
#define BL_TAG_UPDATED_ROW_NEW 0x12       /* UpdatedRow.new */

/* A transaction's rows, table by table. */
#define BL_TAG_PREWRITE_VALUE_SCHEMA_VERSION 0x08 /* PrewriteValue.schema_version */
#define BL_TAG_PREWRITE_VALUE_MUTATIONS 0x12      /* PrewriteValue.mutations */
#define BL_TAG_TABLE_MUTATION_TABLE_ID 0x08       /* TableMutation.table_id */
#define BL_TAG_TABLE_MUTATION_INSERTED_ROWS 0x12  /* TableMutation.inserted_rows */
#define BL_TAG_TABLE_MUTATION_UPDATED_ROWS 0x1A   /* TableMutation.updated_rows */
#define BL_TAG_TABLE_MUTATION_DELETED_ROWS 0x32   /* TableMutation.deleted_rows */
#define BL_TAG_TABLE_MUTATION_SEQUENCE 0x3A       /* TableMutation.sequence (packed) */

/* An enum value the image decoder branches on (an int datum under a BOOL column is true/false). */
#define BL_COLUMN_TYPE_BOOL 11 /* ColumnType.BOOL */

#endif /* BINLAKE_TAGS_H */
