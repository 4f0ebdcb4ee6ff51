/*
 * binlake_native.h - the helpers binlake's C extensions share (lake/_imagec.c,
 * source/mysql/_rowsc.c and _framec.c, source/postgres/_pgoutc.c): a growable
 * byte buffer, protobuf varints and zigzag, fixed-width integer reads, the
 * proleptic Gregorian calendar, strict UTF-8 validation, and the two row codec
 * shapes (a Row's column entry, an UpdatedRow) the source decoders write.
 *
 * Every function is static inline, so each extension still compiles to one
 * self-contained module with no shared library between them. Names carry a
 * bl_ / BL_ prefix to stay clear of each file's own (_imagec.c has its own
 * text buffer, Buf, for image JSON with UTF-8 bookkeeping).
 *
 * Include after <Python.h> (with PY_SSIZE_T_CLEAN defined before it).
 * setup.py puts this directory on each extension's include path.
 */
#ifndef BINLAKE_NATIVE_H
#define BINLAKE_NATIVE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "binlake_tags.h"

/* Microseconds in a day: dates travel as micros since the epoch (binlog.proto's date_micros). */
#define BL_DAY_US INT64_C(86400000000)

/* ------------------------------------------------------------------ growable byte buffer */

/* Grows *p (PyMem, NULL when empty) to hold at least `need` bytes: from `first`
 * bytes, doubling, so appending n bytes one at a time costs O(n). -1 with
 * MemoryError set when it cannot. */
static inline int bl_grow(unsigned char **p, size_t *cap, size_t need, size_t first) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : first;
    while (c < need) c *= 2;
    unsigned char *q = PyMem_Realloc(*p, c);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = c;
    return 0;
}

/* Bytes built for a serialized message; `BlBuf b = {0}` is empty, PyMem_Free(b.p) frees it. */
typedef struct {
    unsigned char *p;
    size_t len, cap;
} BlBuf;

static inline int bl_reserve(BlBuf *b, size_t extra) {
    return bl_grow(&b->p, &b->cap, b->len + extra, 256);
}

static inline int bl_put(BlBuf *b, const void *data, size_t n) {
    if (bl_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, data, n); /* n == 0: b->p may still be NULL */
    b->len += n;
    return 0;
}

static inline int bl_byte(BlBuf *b, unsigned char c) {
    return bl_put(b, &c, 1);
}

/* ------------------------------------------------------------------ varints and zigzag */

static inline size_t bl_varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v as a protobuf varint at o (room for bl_varint_len(v) bytes); returns the end. */
static inline unsigned char *bl_write_varint(unsigned char *o, uint64_t v) {
    while (v >= 0x80) {
        *o++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *o++ = (unsigned char)v;
    return o;
}

static inline int bl_varint(BlBuf *b, uint64_t v) {
    if (bl_reserve(b, 10) < 0) return -1;
    b->len = (size_t)(bl_write_varint(b->p + b->len, v) - b->p);
    return 0;
}

/* A varint of at most 10 bytes whose value fits 64 bits; returns the bytes it
 * took, 0 when there is none (truncated, longer, or wider than 64 bits). */
static inline int bl_read_varint(const uint8_t *p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p + i >= end) return 0;
        uint8_t c = p[i];
        if (i == 9 && c > 1) return 0;
        v |= (uint64_t)(c & 0x7F) << (7 * i);
        if (c < 0x80) {
            *out = v;
            return i + 1;
        }
    }
    return 0;
}

/* sint64's encoding: small magnitudes of either sign become small varints. */
static inline uint64_t bl_zigzag(int64_t v) {
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline int64_t bl_unzigzag(uint64_t v) {
    return (int64_t)((v >> 1) ^ (~(v & 1) + 1));
}

/* A tag then a varint (an int / enum / sint field, the value already zigzagged if sint). */
static inline int bl_tagged_varint(BlBuf *b, unsigned char tag, uint64_t v) {
    if (bl_byte(b, tag) < 0) return -1;
    return bl_varint(b, v);
}

/* A length-delimited field: tag, length, bytes. */
static inline int bl_field(BlBuf *b, unsigned char tag, const void *data, size_t n) {
    if (bl_tagged_varint(b, tag, n) < 0) return -1;
    return bl_put(b, data, n);
}

/* ------------------------------------------------------------------ the row codec */

/* One Column { id, value } entry of a Row (Row.columns), its Datum already in d:
 * what the upb serializer writes (the id omitted when 0, as proto3 omits zero). */
static inline int bl_row_column(BlBuf *r, int64_t cid, const BlBuf *d) {
    size_t clen = (cid ? 1 + bl_varint_len((uint64_t)cid) : 0) + 1 + bl_varint_len(d->len) + d->len;
    if (bl_tagged_varint(r, BL_TAG_ROW_COLUMNS, clen) < 0) return -1;
    if (cid && bl_tagged_varint(r, BL_TAG_COLUMN_ID, (uint64_t)cid) < 0) return -1;
    return bl_field(r, BL_TAG_COLUMN_VALUE, d->p, d->len);
}

/* An UpdatedRow of two serialized Rows, appended to u (both written even when empty,
 * as the serializer writes a set message field). */
static inline int bl_updated_row(BlBuf *u, const BlBuf *old_row, const BlBuf *new_row) {
    if (bl_field(u, BL_TAG_UPDATED_ROW_OLD, old_row->p, old_row->len) < 0) return -1;
    return bl_field(u, BL_TAG_UPDATED_ROW_NEW, new_row->p, new_row->len);
}

/* ------------------------------------------------------------------ fixed-width integers */

static inline uint64_t bl_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t bl_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* ------------------------------------------------------------------ calendar */
/* The proleptic Gregorian calendar in days since 1970-01-01 (H. Hinnant's
 * "chrono-compatible low-level date algorithms", written out). */

/* Days from 1970-01-01 to a valid date. */
static inline int64_t bl_days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The date of days since 1970-01-01. */
static inline void bl_civil_from_days(int64_t days, int64_t *y, int *m, int *d) {
    int64_t z = days + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;                                     /* [0, 146096] */
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);             /* [0, 365] */
    int64_t mp = (5 * doy + 2) / 153;                                   /* [0, 11] */
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* Days in month m (1..12) of year y. */
static inline int bl_days_in_month(int64_t y, int64_t m) {
    static const int dm[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return dm[m - 1];
}

/* ------------------------------------------------------------------ UTF-8 */

/* Eight bytes at once, whatever their alignment. */
static inline uint64_t bl_load8(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

#define BL_HIGH_BITS 0x8080808080808080ULL /* the high bit of each of eight bytes */

/* The length of the strictly valid UTF-8 sequence at s, as CPython's strict
 * decoder accepts it (no over-long forms, no surrogates, nothing above
 * U+10FFFF); 0 if invalid. s[0] >= 0x80. */
static inline int bl_utf8_seq(const uint8_t *s, const uint8_t *end) {
    uint8_t c = s[0];
    ptrdiff_t left = end - s;
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (left < 2 || (s[1] & 0xC0) != 0x80) return 0;
        return 2;
    }
    if (c < 0xF0) {
        if (left < 3) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (left < 4) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        return 4;
    }
    return 0;
}

/* Whether s[0:n] is strictly valid UTF-8 (bl_utf8_seq's rules); runs of ASCII,
 * most text, are skipped eight bytes at a time. */
static inline int bl_utf8_valid(const uint8_t *s, size_t n) {
    const uint8_t *p = s, *end = s + n;
    while (p < end) {
        while (end - p >= 8 && !(bl_load8(p) & BL_HIGH_BITS)) p += 8;
        while (p < end && *p < 0x80) p++;
        if (p >= end) break;
        int k = bl_utf8_seq(p, end);
        if (!k) return 0;
        p += k;
    }
    return 1;
}

#endif /* BINLAKE_NATIVE_H */
