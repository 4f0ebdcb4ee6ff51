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

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ------------------------------------------------------------------ values as text
 *
 * Numbers, dates and times as PostgreSQL prints them (pgoutput, COPY) and as
 * MySQL/MariaDB send them in a text-protocol result row: the strict, canonical
 * forms only. A caller that gets -1 / 0 declines the value (the Python path
 * decides). */

static inline int bl_is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Exactly n digits at s as a number; -1 if any is not a digit. */
static inline int64_t bl_digits(const unsigned char *s, int n) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        if (!bl_is_digit(s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* "YYYY-MM-DD" (years 1..9999) -> days since the epoch; 0 ok, -1 not canonical. */
static inline int bl_parse_date(const unsigned char *s, size_t n, int64_t *days, int64_t *year) {
    if (n != 10 || s[4] != '-' || s[7] != '-') return -1;
    int64_t y = bl_digits(s, 4), m = bl_digits(s + 5, 2), d = bl_digits(s + 8, 2);
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > bl_days_in_month(y, m)) return -1;
    *days = bl_days_from_civil(y, m, d);
    *year = y;
    return 0;
}

/* "HH:MM:SS[.f{1,6}]" -> microseconds since midnight (hour <= 23); returns chars read or -1. */
static inline ptrdiff_t bl_parse_time(const unsigned char *s, size_t n, int64_t *us) {
    if (n < 8 || s[2] != ':' || s[5] != ':') return -1;
    int64_t h = bl_digits(s, 2), mi = bl_digits(s + 3, 2), se = bl_digits(s + 6, 2);
    if (h < 0 || h > 23 || mi < 0 || mi > 59 || se < 0 || se > 59) return -1;
    int64_t frac = 0;
    size_t i = 8;
    if (i < n && s[i] == '.') {
        size_t j = i + 1;
        int nd = 0;
        while (j < n && bl_is_digit(s[j]) && nd < 7) { frac = frac * 10 + (s[j] - '0'); j++; nd++; }
        if (nd < 1 || nd > 6) return -1;
        for (int k = nd; k < 6; k++) frac *= 10;
        i = j;
    }
    *us = ((h * 60 + mi) * 60 + se) * 1000000 + frac;
    return (ptrdiff_t)i;
}

/* "[-]D+[.D+]" as PostgreSQL prints a finite numeric, and str(Decimal(text)) == text:
   no leading zeros but one, and Python's plain (not exponent) notation
   (adjusted exponent >= -6). */
static inline int bl_decimal_plain(const unsigned char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    size_t int_start = i;
    while (i < n && bl_is_digit(s[i])) i++;
    size_t int_len = i - int_start;
    if (int_len == 0 || (int_len > 1 && s[int_start] == '0')) return 0;
    size_t frac_len = 0, frac_start = i + 1;
    if (i < n) {
        if (s[i] != '.') return 0;
        i++;
        while (i < n && bl_is_digit(s[i])) i++;
        frac_len = i - frac_start;
        if (frac_len == 0 || i != n) return 0;
    }
    /* coefficient digits without leading zeros; exponent -frac_len */
    size_t total = int_len + frac_len, lead = 0;
    for (size_t k = 0; k < total; k++) {
        unsigned char c = k < int_len ? s[int_start + k] : s[frac_start + (k - int_len)];
        if (c != '0') break;
        lead++;
    }
    long long ndig = (long long)(total - lead);
    if (ndig == 0) ndig = 1;
    long long adjusted = -(long long)frac_len + ndig - 1;
    return adjusted >= -6;
}

/* "YYYY-MM-DD HH:MM:SS[.f{1,6}]" (bl_parse_date, then bl_parse_time) -> microseconds
   since the epoch; returns chars read (the rest is the caller's: a zone, nothing) or -1. */
static inline ptrdiff_t bl_parse_datetime(const unsigned char *s, size_t n, int64_t *us, int64_t *year) {
    int64_t days, t;
    if (n < 19 || s[10] != ' ' || bl_parse_date(s, 10, &days, year) < 0) return -1;
    ptrdiff_t k = bl_parse_time(s + 11, n - 11, &t);
    if (k < 0) return -1;
    *us = days * BL_DAY_US + t;
    return 11 + k;
}

/* A finite number's text ([-+0-9.eE] only: no "inf", "nan", spaces or underscores,
   which Python's float() would also take) -> the double strtod gives, which is
   float(text)'s (both round correctly). 0 ok, -1 declined. */
static inline int bl_parse_double(const unsigned char *s, size_t n, double *out) {
    char tmp[64];
    if (n == 0 || n >= sizeof tmp) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (!bl_is_digit(ch) && ch != '-' && ch != '+' && ch != '.' && ch != 'e' && ch != 'E') return -1;
    }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *endp;
    double v = strtod(tmp, &endp);
    if (endp != tmp + n || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* A Datum's float_value field (tag, then the double's 8 bytes little-endian). */
static inline int bl_float_datum(BlBuf *d, double v) {
    unsigned char le[8];
    uint64_t bits;
    memcpy(&bits, &v, 8);
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(bits >> (8 * i));
    if (bl_byte(d, BL_TAG_DATUM_FLOAT_VALUE) < 0 || bl_put(d, le, 8) < 0) return -1;
    return 0;
}

/* A decimal integer's text (an optional '-' unless `is_unsigned`, then digits) -> its
   int_value (zigzag) or uint_value Datum field in d, as Python's int(text) gives it
   within 64 bits. 1 done, 0 declined (not canonical, out of range), -1 MemoryError. */
static inline int bl_int_text_datum(BlBuf *d, const unsigned char *s, size_t n, int is_unsigned) {
    size_t i = 0;
    int neg = 0;
    if (!is_unsigned && n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 20) return 0;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (!bl_is_digit(s[i])) return 0;
        uint64_t dgt = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - dgt) / 10) return 0;
        v = v * 10 + dgt;
    }
    if (is_unsigned) return bl_tagged_varint(d, BL_TAG_DATUM_UINT_VALUE, v) < 0 ? -1 : 1;
    if ((!neg && v > (uint64_t)INT64_MAX) || (neg && v > (uint64_t)INT64_MAX + 1)) return 0;
    int64_t sv = neg ? (int64_t)(0 - v) : (int64_t)v;
    return bl_tagged_varint(d, BL_TAG_DATUM_INT_VALUE, bl_zigzag(sv)) < 0 ? -1 : 1;
}

/* The MySQL source's FLOAT rule (values._float32): of 6..9 significant digits, the
   shortest text of v whose float32 is v, read back as a double (v itself when none
   is). 0 ok, -1 declined (struct.pack("<f") would raise OverflowError there). */
static inline int bl_float32_shortest(double v, double *out) {
    char text[64];
    *out = v;
    for (int digits = 6; digits < 10; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        double t = strtod(text, NULL);
        float y = (float)t;
        if (isinf(y)) return -1;
        if ((double)y == v) { *out = t; break; }
    }
    return 0;
}

#endif /* BINLAKE_NATIVE_H */
