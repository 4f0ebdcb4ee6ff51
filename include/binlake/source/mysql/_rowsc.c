/*
 * binlake.source.mysql._rowsc - native decoder for the body of MySQL/MariaDB
 * WRITE/UPDATE/DELETE_ROWS events (v1 and v2): the row images straight into
 * the serialized binlake Rows (binlog.proto Row / UpdatedRow) the source puts
 * into its TableMutations.
 *
 * THE CONTRACT: exact equality with the pure-Python path, or no answer.
 *
 *   For every event body, the list of bytes this module returns is byte for
 *   byte what the Python path (mysql-replication's row parser, then
 *   values.convert_value and values.RowEncoder) produces for the same event.
 *   Whenever an event holds anything this code does not reproduce exactly - a
 *   NULL (or a column missing from the image) in a column that may not be
 *   NULL, text that is not valid in its charset, NaN or an infinity, a zero or
 *   impossible date, a TIME that is negative or a day or more, an ENUM index
 *   past its members, a BIT wider than its column, a truncated body - decode()
 *   returns None and the *whole event* goes to the Python path, which gives
 *   the value or raises the error it always raised. Column types this module
 *   does not decode at all (JSON, GEOMETRY, multi-byte charsets other than
 *   UTF-8, the pre-5.6 DATETIME/TIME encodings) never get a plan
 *   (rowsplan.build_plan returns None), so their tables always take the
 *   Python path.
 *
 * Why native: mysql-replication parses a row in Python (one call and one
 * struct.unpack per column, a dict per image), then binlake converts each
 * value and builds a protobuf message per column; on the benchmark's table
 * that is ~200 us per row change, here it is one pass over the bytes.
 *
 * The API (rowsplan.py builds the plan from the TABLE_MAP columns and the
 * tracked table definition):
 *   Plan(cols)   cols: [(op, size, a, b, column id, nullable, null_as_empty,
 *                        members or None, byte table or None)] in column order
 *   plan.decode(body, start, end, update, bitmap1, bitmap2)
 *                -> [serialized Row | UpdatedRow] or None (ask Python)
 *   prewrite_value(schema_version, [(table_id, inserted, updated, deleted, sequence)])
 *                -> a transaction's serialized PrewriteValue (see the function)
 *
 * Wire format written (what the upb serializer writes for these messages; the
 * tags are binlake_tags.h's):
 *   Row        = { 0x0A len Column }*
 *   Column     = [0x08 varint(id)] (omitted for id 0) 0x12 len Datum
 *   Datum      = one oneof field: is_null 0x08 01, int 0x10 zigzag, uint 0x18,
 *                float 0x21 fixed64, decimal 0x2A, string 0x32, bytes 0x3A,
 *                date 0x40 zigzag, datetime 0x48 zigzag, time 0x50 zigzag
 *   UpdatedRow = 0x0A len Row(before) 0x12 len Row(after)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binlake_native.h"

enum {
    OP_INT = 1,       /* size 1,2,3,4,8 little-endian; a: unsigned read; b: uint out */
    OP_YEAR = 2,      /* 1 byte + 1900 */
    OP_FLOAT32 = 3,   /* a: 1 = shortest text that is the same float32 (values._float32) */
    OP_DOUBLE = 4,
    OP_DECIMAL = 5,   /* a precision, b scale */
    OP_STRING = 6,    /* size: length prefix bytes; table NULL = UTF-8, else a byte -> code point table */
    OP_BYTES = 7,     /* size: length prefix bytes; a: pad with NULs to this length (BINARY) */
    OP_ENUM = 8,      /* size; members[0] is "" */
    OP_SET = 9,       /* size; members in definition order */
    OP_BIT = 10,      /* size: bytes in the binlog; a: bits; b: bytes out */
    OP_DATE = 11,
    OP_DATETIME2 = 12, /* a: fsp */
    OP_TIMESTAMP2 = 13, /* a: fsp */
    OP_TIME2 = 14,    /* a: fsp */
    OP_TIMESTAMP = 15,
};

typedef struct {
    int op, size, a, b;
    int64_t cid;
    int nullable, null_empty;
    Py_ssize_t nmembers;
    char **members;
    Py_ssize_t *mlen;
    int32_t table[256]; /* OP_STRING single-byte charsets: code point or -1 */
    int has_table;
} Col;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Col *cols;
} PlanObject;

/* ------------------------------------------------------------------ helpers */

/* The fractional seconds of DATETIME2/TIME2/TIMESTAMP2 as microseconds (as the
   library reads them: big-endian, odd precisions stored with one more digit). */
static int read_fsp(const unsigned char **pp, const unsigned char *end, int fsp, int64_t *us) {
    int n = (fsp + 1) / 2;
    *us = 0;
    if (n == 0) return 0;
    if (end - *pp < n) return -1;
    int64_t v = (int64_t)bl_be(*pp, n);
    *pp += n;
    if (v >= ((int64_t)1 << (8 * n - 1))) return -1; /* a negative fraction: not a plain value */
    if (fsp % 2) v /= 10;
    for (int i = fsp; i < 6; i++) v *= 10;
    *us = v;
    return 0;
}

static int put_utf8(BlBuf *b, uint32_t cp) {
    unsigned char t[4];
    int n;
    if (cp < 0x80) { t[0] = cp; n = 1; }
    else if (cp < 0x800) { t[0] = 0xC0 | (cp >> 6); t[1] = 0x80 | (cp & 0x3F); n = 2; }
    else if (cp < 0x10000) { t[0] = 0xE0 | (cp >> 12); t[1] = 0x80 | ((cp >> 6) & 0x3F); t[2] = 0x80 | (cp & 0x3F); n = 3; }
    else { t[0] = 0xF0 | (cp >> 18); t[1] = 0x80 | ((cp >> 12) & 0x3F); t[2] = 0x80 | ((cp >> 6) & 0x3F); t[3] = 0x80 | (cp & 0x3F); n = 4; }
    return bl_put(b, t, n);
}

/* ------------------------------------------------------------------ DECIMAL */

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

/* MySQL's binary DECIMAL -> str(decimal.Decimal(text the library builds)).
   Returns bytes consumed, 0 for "ask Python", -1 on error. */
static int decimal_text(const unsigned char *p, const unsigned char *end, int precision, int scale, BlBuf *out) {
    int integral = precision - scale;
    int ui = integral / 9, uf = scale / 9, ci = integral - ui * 9, cf = scale - uf * 9;
    int size = DIG2BYTES[ci] + ui * 4 + uf * 4 + DIG2BYTES[cf];
    if (size <= 0 || size > 64 || end - p < size) return 0;
    unsigned char b[64];
    memcpy(b, p, size);
    int negative = !(b[0] & 0x80);
    b[0] ^= 0x80;
    if (negative)
        for (int i = 0; i < size; i++) b[i] ^= 0xFF;
    char digits[160];
    int nd = 0, k = 0;
    static const uint32_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};
    /* integral part: the leading group without padding, then 9-digit groups */
    if (DIG2BYTES[ci]) {
        uint32_t v = (uint32_t)bl_be(b + k, DIG2BYTES[ci]);
        k += DIG2BYTES[ci];
        if (v >= POW10[ci]) return 0;
        nd += snprintf(digits + nd, sizeof digits - nd, "%u", v);
    }
    for (int i = 0; i < ui; i++, k += 4) {
        uint32_t v = (uint32_t)bl_be(b + k, 4);
        if (v >= POW10[9]) return 0;
        nd += snprintf(digits + nd, sizeof digits - nd, "%09u", v);
    }
    for (int i = 0; i < uf; i++, k += 4) {
        uint32_t v = (uint32_t)bl_be(b + k, 4);
        if (v >= POW10[9]) return 0;
        nd += snprintf(digits + nd, sizeof digits - nd, "%09u", v);
    }
    if (DIG2BYTES[cf]) {
        uint32_t v = (uint32_t)bl_be(b + k, DIG2BYTES[cf]);
        if (v >= POW10[cf]) return 0;
        nd += snprintf(digits + nd, sizeof digits - nd, "%0*u", cf, v);
    }
    /* Decimal's coefficient: the digits without leading zeros ("0" if none), exponent -scale. */
    int lead = 0;
    while (lead < nd && digits[lead] == '0') lead++;
    const char *coeff = digits + lead;
    int clen = nd - lead;
    if (clen == 0) { coeff = "0"; clen = 1; }
    /* Decimal.__str__ (to-scientific-string) for exponent -scale <= 0. */
    int exp = -scale;
    int leftdigits = exp + clen;
    int dotplace = leftdigits > -6 ? leftdigits : 1;
    char text[200];
    int t = 0;
    if (negative) text[t++] = '-';
    if (dotplace <= 0) {
        text[t++] = '0';
        text[t++] = '.';
        for (int i = 0; i < -dotplace; i++) text[t++] = '0';
        memcpy(text + t, coeff, clen);
        t += clen;
    } else if (dotplace >= clen) {
        memcpy(text + t, coeff, clen);
        t += clen;
        for (int i = 0; i < dotplace - clen; i++) text[t++] = '0';
    } else {
        memcpy(text + t, coeff, dotplace);
        t += dotplace;
        text[t++] = '.';
        memcpy(text + t, coeff + dotplace, clen - dotplace);
        t += clen - dotplace;
    }
    if (leftdigits != dotplace) t += snprintf(text + t, sizeof text - t, "E%+d", leftdigits - dotplace);
    if (bl_field(out, BL_TAG_DATUM_DECIMAL_VALUE, text, t) < 0) return -1;
    return size;
}

/* ------------------------------------------------------------------ one value */

/* Decodes one non-NULL value at *pp into the Datum buffer d.
   Returns 1 done, 0 ask Python, -1 error (exception set). */
static int decode_value(const Col *c, const unsigned char **pp, const unsigned char *end, BlBuf *d) {
    const unsigned char *p = *pp;
    switch (c->op) {
    case OP_INT: {
        if (end - p < c->size) return 0;
        uint64_t u = bl_le(p, c->size);
        p += c->size;
        if (c->b) {
            if (bl_tagged_varint(d, BL_TAG_DATUM_UINT_VALUE, u) < 0) return -1;
        } else {
            int64_t v;
            if (c->a) v = (int64_t)u; /* an unsigned read under an int column: fits below 2^63 */
            else {
                int bits = 8 * c->size;
                v = bits == 64 ? (int64_t)u : (int64_t)(u ^ ((uint64_t)1 << (bits - 1))) - ((int64_t)1 << (bits - 1));
            }
            if (c->a && c->size == 8 && u > (uint64_t)INT64_MAX) return 0;
            if (bl_tagged_varint(d, BL_TAG_DATUM_INT_VALUE, bl_zigzag(v)) < 0) return -1;
        }
        break;
    }
    case OP_YEAR: {
        if (end - p < 1) return 0;
        int64_t v = (int64_t)p[0] + 1900;
        p += 1;
        if (bl_tagged_varint(d, BL_TAG_DATUM_INT_VALUE, bl_zigzag(v)) < 0) return -1;
        break;
    }
    case OP_FLOAT32: {
        if (end - p < 4) return 0;
        float f;
        memcpy(&f, p, 4);
        p += 4;
        double v = (double)f, out = v;
        if (!isfinite(v)) return 0;
        if (c->a && bl_float32_shortest(v, &out) < 0) return 0;
        if (bl_byte(d, BL_TAG_DATUM_FLOAT_VALUE) < 0 || bl_put(d, &out, 8) < 0) return -1;
        break;
    }
    case OP_DOUBLE: {
        if (end - p < 8) return 0;
        double v;
        memcpy(&v, p, 8);
        p += 8;
        if (!isfinite(v)) return 0;
        if (bl_byte(d, BL_TAG_DATUM_FLOAT_VALUE) < 0 || bl_put(d, &v, 8) < 0) return -1;
        break;
    }
    case OP_DECIMAL: {
        int n = decimal_text(p, end, c->a, c->b, d);
        if (n <= 0) return n;
        p += n;
        break;
    }
    case OP_STRING:
    case OP_BYTES: {
        if (end - p < c->size) return 0;
        uint64_t n = bl_le(p, c->size);
        p += c->size;
        if ((uint64_t)(end - p) < n) return 0;
        if (c->op == OP_BYTES) {
            size_t pad = (c->a > 0 && n < (uint64_t)c->a) ? (size_t)c->a - n : 0;
            if (bl_tagged_varint(d, BL_TAG_DATUM_BYTES_VALUE, n + pad) < 0 || bl_put(d, p, n) < 0) return -1;
            if (pad) {
                if (bl_reserve(d, pad) < 0) return -1;
                memset(d->p + d->len, 0, pad);
                d->len += pad;
            }
        } else if (!c->has_table) {
            if (!bl_utf8_valid(p, n)) return 0;
            if (bl_field(d, BL_TAG_DATUM_STRING_VALUE, p, n) < 0) return -1;
        } else {
            BlBuf s = {0};
            for (uint64_t i = 0; i < n; i++) {
                int32_t cp = c->table[p[i]];
                if (cp < 0) { PyMem_Free(s.p); return 0; }
                if (put_utf8(&s, (uint32_t)cp) < 0) { PyMem_Free(s.p); return -1; }
            }
            int r = bl_field(d, BL_TAG_DATUM_STRING_VALUE, s.p, s.len);
            PyMem_Free(s.p);
            if (r < 0) return -1;
        }
        p += n;
        break;
    }
    case OP_ENUM: {
        if (end - p < c->size) return 0;
        uint64_t i = bl_le(p, c->size);
        p += c->size;
        if (i >= (uint64_t)c->nmembers) return 0;
        if (bl_field(d, BL_TAG_DATUM_STRING_VALUE, c->members[i], c->mlen[i]) < 0) return -1;
        break;
    }
    case OP_SET: {
        if (end - p < c->size) return 0;
        uint64_t mask = bl_le(p, c->size);
        p += c->size;
        BlBuf s = {0};
        int first = 1;
        for (Py_ssize_t i = 0; i < c->nmembers && i < 64; i++) {
            if (!(mask & ((uint64_t)1 << i))) continue;
            if ((!first && bl_byte(&s, ',') < 0) || bl_put(&s, c->members[i], c->mlen[i]) < 0) {
                PyMem_Free(s.p);
                return -1;
            }
            first = 0;
        }
        int r = bl_field(d, BL_TAG_DATUM_STRING_VALUE, s.p, s.len);
        PyMem_Free(s.p);
        if (r < 0) return -1;
        break;
    }
    case OP_BIT: {
        if (end - p < c->size) return 0;
        /* The value's bits: the low (bits % 8 or 8) of the first byte, then whole bytes. */
        unsigned char v[8];
        memcpy(v, p, c->size);
        p += c->size;
        int first_bits = c->size == 1 ? c->a : (c->a % 8 ? c->a % 8 : 8);
        if (first_bits < 8) v[0] &= (unsigned char)((1u << first_bits) - 1);
        /* big-endian into b bytes; the dropped high bytes must be zero (else int.to_bytes raises) */
        unsigned char o[8] = {0};
        for (int i = 0; i < c->size; i++) {
            int j = c->b - c->size + i;
            if (j < 0) {
                if (v[i]) return 0;
            } else {
                o[j] = v[i];
            }
        }
        if (bl_field(d, BL_TAG_DATUM_BYTES_VALUE, o, c->b) < 0) return -1;
        break;
    }
    case OP_DATE: {
        if (end - p < 3) return 0;
        uint32_t t = (uint32_t)bl_le(p, 3);
        p += 3;
        int y = (t >> 9) & 0x7FFF, m = (t >> 5) & 0xF, dd = t & 0x1F;
        if (y < 1 || y > 9999 || m < 1 || m > 12 || dd < 1 || dd > bl_days_in_month(y, m)) return 0;
        int64_t micros = bl_days_from_civil(y, m, dd) * BL_DAY_US;
        if (bl_tagged_varint(d, BL_TAG_DATUM_DATE_MICROS, bl_zigzag(micros)) < 0) return -1;
        break;
    }
    case OP_DATETIME2: {
        if (end - p < 5) return 0;
        uint64_t v = bl_be(p, 5);
        p += 5;
        int ym = (int)((v >> 22) & 0x1FFFF);
        int y = ym / 13, m = ym % 13, dd = (v >> 17) & 0x1F, hh = (v >> 12) & 0x1F, mi = (v >> 6) & 0x3F,
            ss = v & 0x3F;
        int64_t us;
        if (read_fsp(&p, end, c->a, &us) < 0) return 0;
        if (y < 1 || y > 9999 || m < 1 || dd < 1 || dd > bl_days_in_month(y, m) || hh > 23 || mi > 59 || ss > 59)
            return 0;
        int64_t micros = (bl_days_from_civil(y, m, dd) * 86400 + hh * 3600 + mi * 60 + ss) * INT64_C(1000000) + us;
        if (bl_tagged_varint(d, BL_TAG_DATUM_DATETIME_MICROS, bl_zigzag(micros)) < 0) return -1;
        break;
    }
    case OP_TIMESTAMP2:
    case OP_TIMESTAMP: {
        if (end - p < 4) return 0;
        int64_t secs = c->op == OP_TIMESTAMP2 ? (int64_t)(int32_t)(uint32_t)bl_be(p, 4) : (int64_t)bl_le(p, 4);
        p += 4;
        int64_t us = 0;
        if (c->op == OP_TIMESTAMP2 && read_fsp(&p, end, c->a, &us) < 0) return 0;
        if (secs < 0) return 0;
        int64_t micros = secs * INT64_C(1000000) + us;
        if (bl_tagged_varint(d, BL_TAG_DATUM_DATETIME_MICROS, bl_zigzag(micros)) < 0) return -1;
        break;
    }
    case OP_TIME2: {
        if (end - p < 3) return 0;
        uint32_t v = (uint32_t)bl_be(p, 3);
        p += 3;
        if (!(v & 0x800000)) return 0; /* negative: outside what binlake's time carries */
        int64_t hh = (v >> 12) & 0x3FF, mi = (v >> 6) & 0x3F, ss = v & 0x3F, us;
        if (read_fsp(&p, end, c->a, &us) < 0) return 0;
        int64_t micros = ((hh * 60 + mi) * 60 + ss) * INT64_C(1000000) + us;
        if (micros < 0 || micros >= BL_DAY_US) return 0;
        if (bl_tagged_varint(d, BL_TAG_DATUM_TIME_MICROS, bl_zigzag(micros)) < 0) return -1;
        break;
    }
    default:
        return 0;
    }
    *pp = p;
    return 1;
}

/* One row image: the null bitmap, then each present, non-NULL column. Appends
   the serialized Row to r. Returns 1, 0 (ask Python) or -1. */
static int decode_image(const PlanObject *pl, const unsigned char **pp, const unsigned char *end,
                        const unsigned char *bitmap, BlBuf *r, BlBuf *d) {
    const unsigned char *p = *pp;
    Py_ssize_t n = pl->ncols, present = 0;
    for (Py_ssize_t i = 0; i < n; i++) present += (bitmap[i / 8] >> (i % 8)) & 1;
    Py_ssize_t nb = (present + 7) / 8;
    if (end - p < nb) return 0;
    const unsigned char *nulls = p;
    p += nb;
    Py_ssize_t ni = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Col *c = &pl->cols[i];
        int isnull = 1;
        if ((bitmap[i / 8] >> (i % 8)) & 1) {
            isnull = (nulls[ni / 8] >> (ni % 8)) & 1;
            ni++;
        }
        d->len = 0;
        if (isnull) {
            if (c->null_empty) {
                if (bl_field(d, BL_TAG_DATUM_STRING_VALUE, "", 0) < 0) return -1;
            } else if (c->nullable) {
                if (bl_tagged_varint(d, BL_TAG_DATUM_IS_NULL, 1) < 0) return -1;
            } else {
                return 0;
            }
        } else {
            int rc = decode_value(c, &p, end, d);
            if (rc <= 0) return rc;
        }
        if (bl_row_column(r, c->cid, d) < 0) return -1;
    }
    *pp = p;
    return 1;
}

/* ------------------------------------------------------------------ Plan */

static void plan_free_cols(PlanObject *self) {
    if (!self->cols) return;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Col *c = &self->cols[i];
        for (Py_ssize_t j = 0; j < c->nmembers; j++) PyMem_Free(c->members[j]);
        PyMem_Free(c->members);
        PyMem_Free(c->mlen);
    }
    PyMem_Free(self->cols);
    self->cols = NULL;
}

static void Plan_dealloc(PlanObject *self) {
    plan_free_cols(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    PyObject *cols;
    static char *kwlist[] = {"cols", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &cols)) return -1;
    PyObject *seq = PySequence_Fast(cols, "cols must be a sequence");
    if (!seq) return -1;
    plan_free_cols(self);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->cols = PyMem_Calloc(n ? n : 1, sizeof(Col));
    self->ncols = n;
    if (!self->cols) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        Col *c = &self->cols[i];
        PyObject *members, *table;
        long long cid;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiiiLppOO", &c->op, &c->size, &c->a, &c->b, &cid,
                              &c->nullable, &c->null_empty, &members, &table))
            goto fail;
        c->cid = cid;
        if ((c->op == OP_INT && c->size != 1 && c->size != 2 && c->size != 3 && c->size != 4 && c->size != 8) ||
            ((c->op == OP_STRING || c->op == OP_BYTES) && (c->size < 1 || c->size > 4)) ||
            ((c->op == OP_ENUM || c->op == OP_SET) && (c->size < 1 || c->size > 8)) ||
            (c->op == OP_BIT && (c->size < 1 || c->size > 8 || c->b < 1 || c->b > 8)) ||
            (c->op == OP_DECIMAL && (c->a < 1 || c->a > 65 || c->b < 0 || c->b > c->a)) ||
            ((c->op == OP_DATETIME2 || c->op == OP_TIMESTAMP2 || c->op == OP_TIME2) && (c->a < 0 || c->a > 6)) ||
            c->op < OP_INT || c->op > OP_TIMESTAMP) {
            PyErr_Format(PyExc_ValueError, "column %zd: invalid plan entry (op %d, size %d)", i, c->op, c->size);
            goto fail;
        }
        if (members != Py_None) {
            PyObject *ms = PySequence_Fast(members, "members must be a sequence of bytes");
            if (!ms) goto fail;
            Py_ssize_t m = PySequence_Fast_GET_SIZE(ms);
            c->members = PyMem_Calloc(m ? m : 1, sizeof(char *));
            c->mlen = PyMem_Calloc(m ? m : 1, sizeof(Py_ssize_t));
            if (!c->members || !c->mlen) { Py_DECREF(ms); PyErr_NoMemory(); goto fail; }
            for (Py_ssize_t j = 0; j < m; j++) {
                char *s;
                Py_ssize_t sl;
                if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(ms, j), &s, &sl) < 0) { Py_DECREF(ms); goto fail; }
                c->members[j] = PyMem_Malloc(sl ? sl : 1);
                if (!c->members[j]) { Py_DECREF(ms); PyErr_NoMemory(); goto fail; }
                memcpy(c->members[j], s, sl);
                c->mlen[j] = sl;
                c->nmembers = j + 1;
            }
            Py_DECREF(ms);
        }
        if (table != Py_None) {
            PyObject *ts = PySequence_Fast(table, "table must be a sequence of 256 ints");
            if (!ts) goto fail;
            if (PySequence_Fast_GET_SIZE(ts) != 256) {
                Py_DECREF(ts);
                PyErr_SetString(PyExc_ValueError, "a byte table has 256 entries");
                goto fail;
            }
            for (int j = 0; j < 256; j++) {
                long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(ts, j));
                if (v == -1 && PyErr_Occurred()) { Py_DECREF(ts); goto fail; }
                c->table[j] = (int32_t)v;
            }
            c->has_table = 1;
            Py_DECREF(ts);
        }
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    plan_free_cols(self);
    self->ncols = 0;
    return -1;
}

static PyObject *Plan_decode(PlanObject *self, PyObject *args) {
    Py_buffer body, bm1, bm2 = {0};
    Py_ssize_t start, stop;
    int update;
    PyObject *bm2obj;
    if (!PyArg_ParseTuple(args, "y*nnpy*O", &body, &start, &stop, &update, &bm1, &bm2obj)) return NULL;
    PyObject *result = NULL;
    BlBuf r1 = {0}, r2 = {0}, d = {0}, u = {0};
    int have2 = 0;
    if (update) {
        if (PyObject_GetBuffer(bm2obj, &bm2, PyBUF_SIMPLE) < 0) goto done;
        have2 = 1;
    }
    Py_ssize_t need = (self->ncols + 7) / 8;
    if (start < 0 || stop > body.len || start > stop || bm1.len < need || (update && bm2.len < need) ||
        self->ncols == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const unsigned char *p = (const unsigned char *)body.buf + start, *end = (const unsigned char *)body.buf + stop;
    PyObject *list = PyList_New(0);
    if (!list) goto done;
    while (p < end) {
        /* A row that reads no byte (a bitmap naming no column) would repeat forever:
           such an event is not one this plan can read, so Python decides. */
        const unsigned char *row_start = p;
        r1.len = 0;
        int rc = decode_image(self, &p, end, bm1.buf, &r1, &d);
        PyObject *item = NULL;
        if (rc > 0 && update) {
            r2.len = 0;
            rc = decode_image(self, &p, end, bm2.buf, &r2, &d);
            if (rc > 0) {
                u.len = 0;
                if (bl_updated_row(&u, &r1, &r2) < 0)
                    rc = -1;
                else
                    item = PyBytes_FromStringAndSize((const char *)u.p, u.len);
            }
        } else if (rc > 0) {
            item = PyBytes_FromStringAndSize(r1.p ? (const char *)r1.p : "", r1.len);
        }
        if (rc > 0 && p == row_start) {
            Py_XDECREF(item);
            rc = 0;
        }
        if (rc == 0) {
            Py_DECREF(list);
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (rc < 0 || !item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            goto done;
        }
        Py_DECREF(item);
    }
    result = list;
done:
    PyMem_Free(r1.p);
    PyMem_Free(r2.p);
    PyMem_Free(d.p);
    PyMem_Free(u.p);
    PyBuffer_Release(&body);
    PyBuffer_Release(&bm1);
    if (have2) PyBuffer_Release(&bm2);
    return result;
}

static PyObject *Plan_len(PlanObject *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSsize_t(self->ncols); }

static PyMethodDef Plan_methods[] = {
    {"decode", (PyCFunction)Plan_decode, METH_VARARGS,
     "decode($self, body, start, end, update, bitmap1, bitmap2, /)\n--\n\n"
     "Returns a list of serialized Row/UpdatedRow, or None"},
    {"columns", (PyCFunction)Plan_len, METH_NOARGS, "columns($self, /)\n--\n\nThe number of columns in the plan."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.source.mysql._rowsc.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(cols)\n--\n\nA table version's decoding plan (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};


/* ------------------------------------------------------------------ a transaction's PrewriteValue */

/* prewrite_value(schema_version, [(table_id, inserted, updated, deleted, sequence)])
   -> the serialized PrewriteValue, byte for byte what the upb serializer writes for
   the message holding these lists (fields in number order: schema_version, then each
   TableMutation: table_id, inserted_rows, updated_rows, deleted_rows, sequence packed).
   Why: filling a TableMutation's repeated fields row by row and serializing it copied
   every row twice more, with per-row work in each copy; here the size is summed first
   and every row copied once into the result. sequence is a bytes of MutationType
   values (each < 128, one byte each as a varint). */
static int rows_size(PyObject *list, size_t *size) {
    if (!PyList_Check(list)) { PyErr_SetString(PyExc_TypeError, "rows must be a list of bytes"); return -1; }
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(r)) { PyErr_SetString(PyExc_TypeError, "rows must be a list of bytes"); return -1; }
        size_t len = (size_t)PyBytes_GET_SIZE(r);
        *size += 1 + bl_varint_len(len) + len;
    }
    return 0;
}

static unsigned char *put_rows(unsigned char *o, unsigned char tag, PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(list, i);
        size_t len = (size_t)PyBytes_GET_SIZE(r);
        *o++ = tag;
        o = bl_write_varint(o, len);
        memcpy(o, PyBytes_AS_STRING(r), len);
        o += len;
    }
    return o;
}

static PyObject *mod_prewrite_value(PyObject *Py_UNUSED(m), PyObject *args) {
    long long sv;
    PyObject *muts;
    if (!PyArg_ParseTuple(args, "LO!", &sv, &PyList_Type, &muts)) return NULL;
    Py_ssize_t nm = PyList_GET_SIZE(muts);
    size_t *sizes = PyMem_Calloc(nm ? (size_t)nm : 1, sizeof(size_t));
    if (!sizes) return PyErr_NoMemory();
    PyObject *result = NULL;
    size_t total = sv ? 1 + bl_varint_len((uint64_t)sv) : 0;
    for (Py_ssize_t k = 0; k < nm; k++) {
        PyObject *t = PyList_GET_ITEM(muts, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5 || !PyLong_Check(PyTuple_GET_ITEM(t, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(t, 4))) {
            PyErr_SetString(PyExc_TypeError, "a mutation is (table_id, inserted, updated, deleted, sequence bytes)");
            goto done;
        }
        long long tid = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        if (tid == -1 && PyErr_Occurred()) goto done;
        size_t size = tid ? 1 + bl_varint_len((uint64_t)tid) : 0;
        for (int f = 1; f <= 3; f++)
            if (rows_size(PyTuple_GET_ITEM(t, f), &size) < 0) goto done;
        PyObject *seq = PyTuple_GET_ITEM(t, 4);
        size_t ns = (size_t)PyBytes_GET_SIZE(seq);
        const unsigned char *sp = (const unsigned char *)PyBytes_AS_STRING(seq);
        for (size_t i = 0; i < ns; i++)
            if (sp[i] >= 0x80) { PyErr_SetString(PyExc_ValueError, "a sequence value past 127"); goto done; }
        if (ns) size += 1 + bl_varint_len(ns) + ns;
        sizes[k] = size;
        total += 1 + bl_varint_len(size) + size;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!result) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    if (sv) { *o++ = BL_TAG_PREWRITE_VALUE_SCHEMA_VERSION; o = bl_write_varint(o, (uint64_t)sv); }
    for (Py_ssize_t k = 0; k < nm; k++) {
        PyObject *t = PyList_GET_ITEM(muts, k);
        *o++ = BL_TAG_PREWRITE_VALUE_MUTATIONS;
        o = bl_write_varint(o, sizes[k]);
        long long tid = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        if (tid) { *o++ = BL_TAG_TABLE_MUTATION_TABLE_ID; o = bl_write_varint(o, (uint64_t)tid); }
        o = put_rows(o, BL_TAG_TABLE_MUTATION_INSERTED_ROWS, PyTuple_GET_ITEM(t, 1));
        o = put_rows(o, BL_TAG_TABLE_MUTATION_UPDATED_ROWS, PyTuple_GET_ITEM(t, 2));
        o = put_rows(o, BL_TAG_TABLE_MUTATION_DELETED_ROWS, PyTuple_GET_ITEM(t, 3));
        PyObject *seq = PyTuple_GET_ITEM(t, 4);
        size_t ns = (size_t)PyBytes_GET_SIZE(seq);
        if (ns) {
            *o++ = BL_TAG_TABLE_MUTATION_SEQUENCE;
            o = bl_write_varint(o, ns);
            memcpy(o, PyBytes_AS_STRING(seq), ns);
            o += ns;
        }
    }
done:
    PyMem_Free(sizes);
    return result;
}

static PyMethodDef rowsc_functions[] = {
    {"prewrite_value", mod_prewrite_value, METH_VARARGS,
     "prewrite_value(schema_version, mutations, /)\n--\n\n"
     "Returns the serialized PrewriteValue of mutations: [(table_id, inserted, updated, deleted, sequence)]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rowsc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_rowsc",
    .m_doc = "Native decoder of MySQL/MariaDB row-event bodies into binlake Rows.",
    .m_size = -1,
    .m_methods = rowsc_functions,
};

PyMODINIT_FUNC PyInit__rowsc(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&rowsc_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
