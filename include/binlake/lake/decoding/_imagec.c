/*
 * binlake.lake.decoding._imagec - native accelerator for the hot step of decoding
 * binlogs into change rows: serialized Row / UpdatedRow bytes + a per-table
 * plan -> image JSON strings (the canonical format binlake.lake.image's
 * module docstring defines).
 *
 * THE CONTRACT: exact equality with the pure-Python path, or no answer.
 *
 *   For every input, a string this module returns is byte-for-byte the string
 *   binlake.lake.image.TablePlan.images / update_images (the reference)
 *   returns for the same bytes. Whenever the input is anything this code does
 *   not handle *exactly* - bytes that are not the canonical encoding the codec
 *   writes (unknown fields, repeated fields, fields out of order, over-long
 *   varints), text that is not valid UTF-8, a float that is NaN or infinite, a
 *   date or datetime outside years 1..9999, a truncated or garbled row - it
 *   does not guess: the row goes to the Python path, which produces the
 *   result, or raises the proper CorruptBinlogError-bound exception with the
 *   same message as if this module did not exist. This module itself never
 *   raises for bad data (only MemoryError and the like).
 *
 * Why native: CPython spends 13-20 us per row change on this step (protobuf
 * parse, one formatting call per column, string joins); here it is one pass
 * over the bytes into a buffer and one str per image.
 *
 * How the reference is mirrored, datum by datum (see _datum_bytes_json and
 * _datum_json in image.py):
 *   - empty datum bytes (missing column) and is_null (tag 0x08, whatever
 *     follows, as the Python fast path does): null;
 *   - string / decimal (0x32 / 0x2A): a length that spans exactly the rest,
 *     strict UTF-8, quoted exactly as json.encoder.encode_basestring (the short
 *     escapes \" \\ \n \r \t \b \f, other controls \u00xx in lower-case hex,
 *     everything else - DEL and non-ASCII included - as is);
 *   - int (0x10, zigzag) and datetime (0x48, zigzag): a varint ending exactly
 *     at the end (non-minimal encodings read as the Python fast path reads
 *     them); int under a BOOL column is true/false; datetime is
 *     YYYY-MM-DDTHH:MM:SS.ffffff of epoch + micros;
 *   - json (0x5A): the UTF-8 text embedded raw;
 *   - the kinds Python reads through a protobuf parse (uint 0x18, float 0x21,
 *     bytes 0x3A, date 0x40, time 0x50) only when they are the single,
 *     minimally encoded field the codec writes: uint as decimal, float as
 *     repr() (PyOS_double_to_string 'r' with Py_DTSF_ADD_DOT_0, the very call
 *     float.__repr__ makes), bytes as {"$base64":"..."}, date as YYYY-MM-DD of
 *     floor(micros / day), time as Python's floor-division formatting;
 *   - anything else: the row goes to Python.
 * A Row is read as the map<int64, bytes> the Python path parses it as (last
 * entry of a column id wins); columns of the row the plan does not name are
 * skipped, plan columns the row lacks are null. In an update, a column whose
 * datum bytes did not change reuses the before image's text, as Python does.
 *
 * The API (used by image.TablePlan; the column order, the '"name":' texts and
 * the key columns all come from the Python plan, so they cannot differ):
 *   Plan(cols, key_idx)          cols: [(column id, '"name":', type)] in image order
 *   plan.images(row)             -> (image, key image) or None (ask Python)
 *   plan.update_images(data)     -> (before, after, key image) or None
 *   Columns()                    growing Arrow string buffers (int32 offsets, UTF-8
 *                                data, validity bitmap) of op, keys, before, after
 *   plan.mutation_into(columns, sequence, inserted, updated, deleted, fallback)
 *                                -> rows appended: mutation's loop writing the images
 *                                   straight into columns (fallback rows' str appended
 *                                   in place); nothing appended on an exception
 *   columns.extend(ops, keys, befores, afters)   rows decoded in Python, appended
 *   columns.take()               -> (rows, 4 x (offsets, data, validity|None, nulls)),
 *                                   as bytes; the columns start empty again
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "binlake_native.h"

#define DIRECT_MAX 4096 /* column ids below this are looked up in a table */

/* Return codes of the internal functions: OK, FALLBACK (let Python decode this
 * row), ERROR (a Python exception is set, e.g. MemoryError). */
enum { OK = 0, FALLBACK = 1, ERROR = -1 };

/* ------------------------------------------------------------------ buffer */
/* Text is built as UTF-8. `extra` (continuation bytes written) and `maxlead`
 * (the largest lead byte written, 0 for ASCII only) are kept as it is written,
 * so the str can be made at its final size and kind without a decoding pass to
 * find them (see make_str). */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    Py_ssize_t extra;
    int maxlead;
    int heap;
} Buf;

#define STACK_BUF 4096
#define BUF_ON(b, stack)                                          \
    do {                                                          \
        (b).data = (stack);                                       \
        (b).len = 0;                                              \
        (b).cap = (Py_ssize_t)sizeof(stack);                      \
        (b).extra = 0;                                            \
        (b).maxlead = 0;                                          \
        (b).heap = 0;                                             \
    } while (0)

static void buf_free(Buf *b) {
    if (b->heap) PyMem_Free(b->data);
    b->heap = 0;
}

static int buf_grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap * 2;
    if (need > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return ERROR;
    }
    if (cap < b->len + need) cap = b->len + need;
    char *p;
    if (b->heap) {
        p = PyMem_Realloc(b->data, (size_t)cap);
    } else {
        p = PyMem_Malloc((size_t)cap);
        if (p) memcpy(p, b->data, (size_t)b->len);
    }
    if (!p) {
        PyErr_NoMemory();
        return ERROR;
    }
    b->data = p;
    b->cap = cap;
    b->heap = 1;
    return OK;
}

static inline int buf_reserve(Buf *b, Py_ssize_t need) {
    return (b->cap - b->len >= need) ? OK : buf_grow(b, need);
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) != OK) return ERROR;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return OK;
}

#define PUT_LIT(b, lit) buf_put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* ------------------------------------------------------------------ varints */
/* bl_read_varint (binlake_native.h) declines a varint the Python reader would read
 * otherwise or refuse (truncated, longer than 10 bytes, wider than 64 bits): those
 * rows go to it. */
/* As bl_read_varint, and minimally encoded (no trailing zero groups): the only
 * encoding of a value protobuf writes, used where Python reads through a full
 * protobuf parse. */
static inline int read_varint_min(const uint8_t *p, const uint8_t *end, uint64_t *out) {
    int n = bl_read_varint(p, end, out);
    if (n > 1 && p[n - 1] == 0) return 0;
    return n;
}

/* Floor division and modulo (Python's // and %) for a positive divisor. */
static inline int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0) q -= 1;
    return q;
}

static inline int64_t floormod(int64_t a, int64_t b) {
    int64_t r = a % b;
    if (r < 0) r += b;
    return r;
}

/* ------------------------------------------------------------------ numbers */
static int put_u64(Buf *b, uint64_t v) {
    char tmp[24];
    int i = 24;
    do {
        tmp[--i] = (char)('0' + (v % 10));
        v /= 10;
    } while (v);
    return buf_put(b, tmp + i, 24 - i);
}

static int put_i64(Buf *b, int64_t v) {
    if (v < 0) {
        if (PUT_LIT(b, "-") != OK) return ERROR;
        return put_u64(b, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(b, (uint64_t)v);
}

/* Zero-padded to `width` digits, as Python's format(v, "0{width}d") for v >= 0. */
static int put_padded(Buf *b, int64_t v, int width) {
    char tmp[24];
    int i = 24;
    uint64_t u = (uint64_t)v;
    do {
        tmp[--i] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    while (24 - i < width) tmp[--i] = '0';
    return buf_put(b, tmp + i, 24 - i);
}

/* Python's f"{v:02d}" for any int64 (the sign counts towards the width). */
static int put_02d(Buf *b, int64_t v) {
    if (v < 0) {
        if (v > -10) {
            /* "-5": already two characters wide, no zero between sign and digit */
            char tmp[2] = {'-', (char)('0' - v)};
            return buf_put(b, tmp, 2);
        }
        return put_i64(b, v);
    }
    return put_padded(b, v, 2);
}

/* ------------------------------------------------------------------ UTF-8 and quoting */
/* 0: copied as is; 1: escaped; 2: first byte of a multi-byte sequence. */
static uint8_t byte_class[256];
/* The short escapes of encode_basestring, 0 where \u00xx is used. */
static char short_escape[32];

static void init_tables(void) {
    for (int c = 0; c < 256; c++) byte_class[c] = c < 0x20 ? 1 : (c < 0x80 ? 0 : 2);
    byte_class['"'] = 1;
    byte_class['\\'] = 1;
    memset(short_escape, 0, sizeof(short_escape));
    short_escape['\n'] = 'n';
    short_escape['\r'] = 'r';
    short_escape['\t'] = 't';
    short_escape['\b'] = 'b';
    short_escape['\f'] = 'f';
}

/* Eight bytes at a time (the usual SWAR bit tricks): whether any byte of w is
 * non-ASCII, or - for quoting - needs an escape. A false "maybe" only sends the
 * word through the byte-by-byte loop, which decides exactly. */
#define ONES 0x0101010101010101ULL
static inline int has_zero_byte(uint64_t w) {
    return ((w - ONES) & ~w & BL_HIGH_BITS) != 0;
}
static inline int plain8(uint64_t w) {
    return !((w & BL_HIGH_BITS) || ((w - ONES * 0x20) & ~w & BL_HIGH_BITS) || has_zero_byte(w ^ (ONES * '"')) ||
             has_zero_byte(w ^ (ONES * '\\')));
}

/* Appends the JSON string of UTF-8 text (encode_basestring's output), or
 * FALLBACK if the text is not valid UTF-8. */
static int put_quoted(Buf *b, const uint8_t *s, Py_ssize_t n) {
    const uint8_t *end = s + n, *run = s, *p = s;
    if (buf_reserve(b, n + 2) != OK) return ERROR;
    b->data[b->len++] = '"';
    while (p < end) {
        /* a run of bytes copied as they are: eight at a time, then one by one */
        while (end - p >= 8 && plain8(bl_load8(p))) p += 8;
        while (p < end && byte_class[*p] == 0) p++;
        if (p >= end) break;
        uint8_t cls = byte_class[*p];
        if (cls == 2) {
            int k = bl_utf8_seq(p, end);
            if (!k) return FALLBACK;
            b->extra += k - 1;
            if (*p > b->maxlead) b->maxlead = *p;
            p += k;
            continue;
        }
        /* an escape: flush the run before it, then 2 or 6 characters */
        if (buf_put(b, (const char *)run, p - run) != OK) return ERROR;
        uint8_t c = *p++;
        run = p;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        if (c == '"' || c == '\\') {
            esc[1] = (char)c;
        } else if (short_escape[c]) {
            esc[1] = short_escape[c];
        } else {
            static const char hex[] = "0123456789abcdef";
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xF];
            if (buf_put(b, esc, 6) != OK) return ERROR;
            continue;
        }
        if (buf_put(b, esc, 2) != OK) return ERROR;
    }
    if (buf_put(b, (const char *)run, end - run) != OK) return ERROR;
    return PUT_LIT(b, "\"");
}

/* Appends UTF-8 text as is (a JSON document), or FALLBACK if it is not valid UTF-8. */
static int put_raw_utf8(Buf *b, const uint8_t *s, Py_ssize_t n) {
    const uint8_t *end = s + n, *p = s;
    while (p < end) {
        while (end - p >= 8 && !(bl_load8(p) & BL_HIGH_BITS)) p += 8;
        while (p < end && *p < 0x80) p++;
        if (p >= end) break;
        int k = bl_utf8_seq(p, end);
        if (!k) return FALLBACK;
        b->extra += k - 1;
        if (*p > b->maxlead) b->maxlead = *p;
        p += k;
    }
    return buf_put(b, (const char *)s, n);
}

/* ------------------------------------------------------------------ other kinds */
static int put_base64(Buf *b, const uint8_t *s, Py_ssize_t n) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    Py_ssize_t out_len = (n + 2) / 3 * 4;
    if (PUT_LIT(b, "{\"$base64\":\"") != OK || buf_reserve(b, out_len + 2) != OK) return ERROR;
    char *o = b->data + b->len;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        *o++ = alphabet[(v >> 18) & 63];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *o++ = alphabet[(v >> 18) & 63];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
        *o++ = alphabet[(v >> 18) & 63];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = '=';
    }
    *o++ = '"';
    *o++ = '}';
    b->len = o - b->data;
    return OK;
}

/* "YYYY-MM-DD" into b (no quotes), FALLBACK outside datetime.date's years 1..9999
 * (where Python raises OverflowError). */
static int put_date(Buf *b, int64_t days) {
    int64_t y;
    int m, d;
    bl_civil_from_days(days, &y, &m, &d);
    if (y < 1 || y > 9999) return FALLBACK;
    if (buf_reserve(b, 10) != OK) return ERROR;
    char *o = b->data + b->len;
    o[0] = (char)('0' + y / 1000);
    o[1] = (char)('0' + y / 100 % 10);
    o[2] = (char)('0' + y / 10 % 10);
    o[3] = (char)('0' + y % 10);
    o[4] = '-';
    o[5] = (char)('0' + m / 10);
    o[6] = (char)('0' + m % 10);
    o[7] = '-';
    o[8] = (char)('0' + d / 10);
    o[9] = (char)('0' + d % 10);
    b->len += 10;
    return OK;
}

/* "HH:MM:SS.ffffff" of microseconds within a day (0 <= us < BL_DAY_US). */
static int put_clock(Buf *b, int64_t us) {
    int64_t h = us / 3600000000LL, mi = us / 60000000LL % 60, s = us / 1000000 % 60, f = us % 1000000;
    if (buf_reserve(b, 15) != OK) return ERROR;
    char *o = b->data + b->len;
    o[0] = (char)('0' + h / 10);
    o[1] = (char)('0' + h % 10);
    o[2] = ':';
    o[3] = (char)('0' + mi / 10);
    o[4] = (char)('0' + mi % 10);
    o[5] = ':';
    o[6] = (char)('0' + s / 10);
    o[7] = (char)('0' + s % 10);
    o[8] = '.';
    for (int i = 14; i >= 9; i--) {
        o[i] = (char)('0' + f % 10);
        f /= 10;
    }
    b->len += 15;
    return OK;
}

/* (_EPOCH + timedelta(microseconds=v)).isoformat(timespec="microseconds"), quoted. */
static int put_datetime(Buf *b, int64_t v) {
    int64_t days = floordiv(v, BL_DAY_US), rest = floormod(v, BL_DAY_US);
    int r;
    if (PUT_LIT(b, "\"") != OK) return ERROR;
    if ((r = put_date(b, days)) != OK) return r;
    if (PUT_LIT(b, "T") != OK || put_clock(b, rest) != OK) return ERROR;
    return PUT_LIT(b, "\"");
}

/* The Python f-string of a time datum: hours unbounded (and negative for negative
 * micros), the rest by floor division and modulo. */
static int put_time(Buf *b, int64_t us) {
    if (PUT_LIT(b, "\"") != OK || put_02d(b, floordiv(us, 3600000000LL)) != OK || PUT_LIT(b, ":") != OK ||
        put_padded(b, floormod(floordiv(us, 60000000LL), 60), 2) != OK || PUT_LIT(b, ":") != OK ||
        put_padded(b, floormod(floordiv(us, 1000000), 60), 2) != OK || PUT_LIT(b, ".") != OK ||
        put_padded(b, floormod(us, 1000000), 6) != OK)
        return ERROR;
    return PUT_LIT(b, "\"");
}

static int put_float(Buf *b, double x) {
    if (!isfinite(x)) return FALLBACK; /* Python raises CorruptBinlogError: let it */
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text) return ERROR;
    int r = buf_put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return r;
}

/* A string-like field (tag, length, payload) spanning all of b..end, as the Python
 * fast path checks it; on OK, *payload / *len point at the payload. */
static inline int whole_string(const uint8_t *b, const uint8_t *end, const uint8_t **payload, uint64_t *len) {
    if (end - b < 2) return FALLBACK; /* Python: b[1] raises IndexError */
    uint64_t n;
    int k;
    if (b[1] < 0x80) {
        n = b[1];
        k = 1;
    } else {
        k = bl_read_varint(b + 1, end, &n);
        if (!k) return FALLBACK;
    }
    if (n != (uint64_t)(end - b - 1 - k)) return FALLBACK;
    *payload = b + 1 + k;
    *len = n;
    return OK;
}

/* Image JSON of one serialized Datum (see the header for the cases). */
static int datum_json(Buf *out, const uint8_t *b, Py_ssize_t n, int col_type) {
    const uint8_t *end = b + n, *payload;
    uint64_t v, len;
    int k;
    if (n == 0) return PUT_LIT(out, "null");
    switch (b[0]) {
    case BL_TAG_DATUM_STRING_VALUE:
    case BL_TAG_DATUM_DECIMAL_VALUE:
        if (whole_string(b, end, &payload, &len) != OK) return FALLBACK;
        return put_quoted(out, payload, (Py_ssize_t)len);
    case BL_TAG_DATUM_INT_VALUE:
        k = bl_read_varint(b + 1, end, &v);
        if (!k || 1 + k != n) return FALLBACK;
        if (col_type == BL_COLUMN_TYPE_BOOL) return v ? PUT_LIT(out, "true") : PUT_LIT(out, "false");
        return put_i64(out, bl_unzigzag(v));
    case BL_TAG_DATUM_IS_NULL: /* the Python fast path answers null without reading on */
        return PUT_LIT(out, "null");
    case BL_TAG_DATUM_DATETIME_MICROS:
        k = bl_read_varint(b + 1, end, &v);
        if (!k || 1 + k != n) return FALLBACK;
        return put_datetime(out, bl_unzigzag(v));
    case BL_TAG_DATUM_JSON_VALUE:
        if (whole_string(b, end, &payload, &len) != OK) return FALLBACK;
        return put_raw_utf8(out, payload, (Py_ssize_t)len);
    /* The kinds Python reads with a full protobuf parse: the single minimal field only. */
    case BL_TAG_DATUM_UINT_VALUE:
        k = read_varint_min(b + 1, end, &v);
        if (!k || 1 + k != n) return FALLBACK;
        return put_u64(out, v);
    case BL_TAG_DATUM_FLOAT_VALUE: { /* fixed64, little-endian */
        if (n != 9) return FALLBACK;
        uint64_t bits = bl_le(b + 1, 8);
        double x;
        memcpy(&x, &bits, sizeof x);
        return put_float(out, x);
    }
    case BL_TAG_DATUM_BYTES_VALUE:
        k = read_varint_min(b + 1, end, &len);
        if (!k || len != (uint64_t)(n - 1 - k)) return FALLBACK;
        return put_base64(out, b + 1 + k, (Py_ssize_t)len);
    case BL_TAG_DATUM_DATE_MICROS: {
        k = read_varint_min(b + 1, end, &v);
        if (!k || 1 + k != n) return FALLBACK;
        int r;
        if (PUT_LIT(out, "\"") != OK) return ERROR;
        if ((r = put_date(out, floordiv(bl_unzigzag(v), BL_DAY_US))) != OK) return r;
        return PUT_LIT(out, "\"");
    }
    case BL_TAG_DATUM_TIME_MICROS:
        k = read_varint_min(b + 1, end, &v);
        if (!k || 1 + k != n) return FALLBACK;
        return put_time(out, bl_unzigzag(v));
    default:
        return FALLBACK;
    }
}

/* ------------------------------------------------------------------ making str */
/* Counts what Buf tracks for UTF-8 text known to be valid (the column-name
 * prefixes, once per plan). */
static void utf8_stats(const char *s, Py_ssize_t n, Py_ssize_t *extra, int *maxlead) {
    *extra = 0;
    *maxlead = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if ((c & 0xC0) == 0x80) (*extra)++;
        else if (c >= 0x80 && c > *maxlead) *maxlead = c;
    }
}

/* Decodes the valid UTF-8 p..end into the str's TYPE array: each run of ASCII
 * eight bytes at a time then byte by byte, then one multi-byte character. Every
 * write is bounds checked against nchars, so wrong bookkeeping can never write
 * past the str (it is detected and the text decoded by CPython instead). */
#define FILL_KIND(TYPE)                                                                        \
    do {                                                                                       \
        TYPE *o = (TYPE *)PyUnicode_DATA(str);                                                 \
        Py_ssize_t i = 0;                                                                      \
        while (p < end) {                                                                      \
            while (end - p >= 8 && nchars - i >= 8 && !(bl_load8(p) & BL_HIGH_BITS)) {         \
                for (int j = 0; j < 8; j++) o[i + j] = (TYPE)p[j];                             \
                i += 8;                                                                        \
                p += 8;                                                                        \
            }                                                                                  \
            while (p < end && *p < 0x80 && i < nchars) o[i++] = (TYPE)*p++;                    \
            if (p >= end) break;                                                               \
            if (i >= nchars) goto mismatch;                                                    \
            uint32_t c = *p;                                                                   \
            if (c < 0x80) {                                                                    \
                goto mismatch; /* unreachable: the run above ends at a non-ASCII byte */       \
            } else if (c < 0xE0) {                                                             \
                c = ((c & 0x1F) << 6) | (p[1] & 0x3F);                                         \
                p += 2;                                                                        \
            } else if (c < 0xF0) {                                                             \
                c = ((c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);       \
                p += 3;                                                                        \
            } else {                                                                           \
                c = ((c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |                     \
                    ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);                            \
                p += 4;                                                                        \
            }                                                                                  \
            o[i++] = (TYPE)c;                                                                  \
        }                                                                                      \
        if (i != nchars || p != end) goto mismatch;                                            \
    } while (0)

/* A str of valid UTF-8 text whose continuation-byte count and largest lead byte
 * are known: allocated once at its final length and kind (CPython's decoder
 * would first guess narrow and widen on the first wide character). */
static PyObject *make_str(const char *data, Py_ssize_t len, Py_ssize_t extra, int maxlead) {
    Py_ssize_t nchars = len - extra;
    if (maxlead == 0) {
        PyObject *str = PyUnicode_New(len, 127);
        if (str) memcpy(PyUnicode_DATA(str), data, (size_t)len);
        return str;
    }
    /* lead bytes C2..C3 give U+0080..U+00FF, up to EF the BMP, F0.. beyond it */
    Py_UCS4 maxchar = maxlead < 0xC4 ? 0xFF : (maxlead < 0xF0 ? 0xFFFF : 0x10FFFF);
    PyObject *str = PyUnicode_New(nchars, maxchar);
    if (!str) return NULL;
    const uint8_t *p = (const uint8_t *)data, *end = p + len;
    if (maxchar == 0xFF) FILL_KIND(Py_UCS1);
    else if (maxchar == 0xFFFF) FILL_KIND(Py_UCS2);
    else FILL_KIND(Py_UCS4);
    return str;
mismatch:
    /* the bookkeeping disagrees with the text (a bug): never return a wrong str */
    Py_DECREF(str);
    return PyUnicode_DecodeUTF8(data, len, "strict");
}

static PyObject *buf_str(const Buf *b) {
    return make_str(b->data, b->len, b->extra, b->maxlead);
}

/* ------------------------------------------------------------------ the plan */
typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Span;

/* Where one column's "name":value text lies in an image, and its UTF-8 bookkeeping. */
typedef struct {
    Py_ssize_t start, end, extra;
    int maxlead;
} Part;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    int64_t *cids;        /* per column, in image (sorted-name) order */
    int *types;
    char *prefixes;       /* the '"name":' texts, UTF-8, back to back */
    Py_ssize_t *pre_off;  /* ncols + 1 offsets into prefixes */
    Py_ssize_t *pre_extra; /* their UTF-8 bookkeeping */
    int *pre_maxlead;
    Py_ssize_t nkeys;
    Py_ssize_t *key_idx;  /* columns of the key image */
    int32_t *direct;      /* column id -> column index (-1: none), ids < direct_len */
    int64_t direct_len;
    int64_t *sorted_cids; /* otherwise: binary search */
    Py_ssize_t *sorted_idx;
} PlanObject;

static PyObject *OP_INSERT, *OP_UPDATE, *OP_DELETE;

static void plan_dealloc(PlanObject *self) {
    PyMem_Free(self->cids);
    PyMem_Free(self->types);
    PyMem_Free(self->prefixes);
    PyMem_Free(self->pre_off);
    PyMem_Free(self->pre_extra);
    PyMem_Free(self->pre_maxlead);
    PyMem_Free(self->key_idx);
    PyMem_Free(self->direct);
    PyMem_Free(self->sorted_cids);
    PyMem_Free(self->sorted_idx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t plan_index(const PlanObject *plan, int64_t cid) {
    if (plan->direct) return (cid >= 0 && cid < plan->direct_len) ? plan->direct[cid] : -1;
    Py_ssize_t lo = 0, hi = plan->ncols;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (plan->sorted_cids[mid] < cid) lo = mid + 1;
        else hi = mid;
    }
    return (lo < plan->ncols && plan->sorted_cids[lo] == cid) ? plan->sorted_idx[lo] : -1;
}

/* Plan(cols, key_idx): cols a sequence of (column id, '"name":' prefix, column type)
 * in image order, key_idx the positions in cols of the key columns. Column ids must
 * be distinct (a row is a map by column id). */
static int plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    PyObject *cols_arg, *keys_arg, *cols = NULL, *keys = NULL;
    static char *kwlist[] = {"cols", "key_idx", NULL};
    Buf pre;
    char pre_stack[256];
    BUF_ON(pre, pre_stack);
    if (self->cids) {
        PyErr_SetString(PyExc_TypeError, "Plan is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Plan", kwlist, &cols_arg, &keys_arg)) return -1;
    cols = PySequence_Fast(cols_arg, "cols must be a sequence");
    if (!cols) goto fail;
    keys = PySequence_Fast(keys_arg, "key_idx must be a sequence");
    if (!keys) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cols), nk = PySequence_Fast_GET_SIZE(keys);
    self->ncols = n;
    self->nkeys = nk;
    self->cids = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    self->types = PyMem_Calloc((size_t)n + 1, sizeof(int));
    self->pre_off = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    self->pre_extra = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    self->pre_maxlead = PyMem_Calloc((size_t)n + 1, sizeof(int));
    self->key_idx = PyMem_Calloc((size_t)nk + 1, sizeof(Py_ssize_t));
    self->sorted_cids = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    self->sorted_idx = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (!self->cids || !self->types || !self->pre_off || !self->pre_extra || !self->pre_maxlead ||
        !self->key_idx || !self->sorted_cids || !self->sorted_idx) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t max_cid = -1;
    int direct_ok = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(cols, i);
        long long cid;
        PyObject *prefix;
        int type;
        if (!PyArg_ParseTuple(item, "LUi:Plan column", &cid, &prefix, &type)) goto fail;
        Py_ssize_t plen;
        const char *utf8 = PyUnicode_AsUTF8AndSize(prefix, &plen);
        if (!utf8 || buf_put(&pre, utf8, plen) != OK) goto fail;
        utf8_stats(utf8, plen, &self->pre_extra[i], &self->pre_maxlead[i]);
        self->cids[i] = cid;
        self->types[i] = type;
        self->pre_off[i + 1] = pre.len;
        if (cid < 0 || cid >= DIRECT_MAX) direct_ok = 0;
        else if (cid > max_cid) max_cid = cid;
    }
    self->prefixes = PyMem_Malloc((size_t)pre.len + 1);
    if (!self->prefixes) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(self->prefixes, pre.data, (size_t)pre.len);
    for (Py_ssize_t i = 0; i < nk; i++) {
        Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(keys, i));
        if (k == -1 && PyErr_Occurred()) goto fail;
        if (k < 0 || k >= n) {
            PyErr_Format(PyExc_ValueError, "key index %zd is not a column position", k);
            goto fail;
        }
        self->key_idx[i] = k;
    }
    /* sorted (column id, position) pairs: insertion sort, tables are small */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i;
        while (j > 0 && self->sorted_cids[j - 1] > self->cids[i]) {
            self->sorted_cids[j] = self->sorted_cids[j - 1];
            self->sorted_idx[j] = self->sorted_idx[j - 1];
            j--;
        }
        self->sorted_cids[j] = self->cids[i];
        self->sorted_idx[j] = i;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        if (self->sorted_cids[i] == self->sorted_cids[i - 1]) {
            PyErr_Format(PyExc_ValueError, "column id %lld appears twice", (long long)self->sorted_cids[i]);
            goto fail;
        }
    }
    if (direct_ok) {
        self->direct_len = max_cid + 1;
        self->direct = PyMem_Malloc(sizeof(int32_t) * (size_t)(self->direct_len + 1));
        if (!self->direct) {
            PyErr_NoMemory();
            goto fail;
        }
        for (int64_t c = 0; c < self->direct_len; c++) self->direct[c] = -1;
        for (Py_ssize_t i = 0; i < n; i++) self->direct[self->cids[i]] = (int32_t)i;
    }
    buf_free(&pre);
    Py_DECREF(cols);
    Py_DECREF(keys);
    return 0;
fail:
    buf_free(&pre);
    Py_XDECREF(cols);
    Py_XDECREF(keys);
    return -1;
}

/* Reads a serialized Row as the map column id -> datum bytes into spans (one per
 * plan column, left empty for columns the row lacks). Only the encoding the
 * codec writes - entries (0x0A) of key (0x08) then optional value (0x12) - is
 * read; anything else is FALLBACK. */
static int row_spans(const PlanObject *plan, const uint8_t *p, const uint8_t *end, Span *spans) {
    for (Py_ssize_t i = 0; i < plan->ncols; i++) spans[i].n = 0;
    while (p < end) {
        uint64_t len, key;
        int k;
        if (*p != BL_TAG_ROW_COLUMNS) return FALLBACK;
        k = bl_read_varint(p + 1, end, &len);
        if (!k || len > (uint64_t)(end - p - 1 - k)) return FALLBACK;
        const uint8_t *e = p + 1 + k, *e_end = e + len;
        p = e_end;
        if (e == e_end || *e != BL_TAG_COLUMN_ID) return FALLBACK;
        k = bl_read_varint(e + 1, e_end, &key);
        if (!k) return FALLBACK;
        e += 1 + k;
        const uint8_t *val = e;
        uint64_t vlen = 0;
        if (e < e_end) {
            if (*e != BL_TAG_COLUMN_VALUE) return FALLBACK;
            k = bl_read_varint(e + 1, e_end, &vlen);
            if (!k || vlen != (uint64_t)(e_end - e - 1 - k)) return FALLBACK;
            val = e + 1 + k;
        }
        Py_ssize_t idx = plan_index(plan, (int64_t)key);
        if (idx >= 0) {
            spans[idx].p = val;
            spans[idx].n = (Py_ssize_t)vlen;
        }
    }
    return OK;
}

/* Appends one column's "name":value text, recording where it lies. */
static int put_column(const PlanObject *plan, Py_ssize_t i, const Span *span, Buf *img, Part *part) {
    Py_ssize_t extra0 = img->extra;
    int maxlead0 = img->maxlead;
    part->start = img->len;
    /* the part's own maxlead: measured from 0, folded back into the image's after */
    img->maxlead = plan->pre_maxlead[i];
    img->extra += plan->pre_extra[i];
    if (buf_put(img, plan->prefixes + plan->pre_off[i], plan->pre_off[i + 1] - plan->pre_off[i]) != OK)
        return ERROR;
    int r = datum_json(img, span->p, span->n, plan->types[i]);
    if (r != OK) return r;
    part->end = img->len;
    part->extra = img->extra - extra0;
    part->maxlead = img->maxlead;
    if (maxlead0 > img->maxlead) img->maxlead = maxlead0;
    return OK;
}

/* Appends a part of another image (an update's unchanged column). */
static int put_part(Buf *img, const Buf *from, const Part *src, Part *part) {
    part->start = img->len;
    if (buf_put(img, from->data + src->start, src->end - src->start) != OK) return ERROR;
    part->end = img->len;
    part->extra = src->extra;
    part->maxlead = src->maxlead;
    img->extra += src->extra;
    if (src->maxlead > img->maxlead) img->maxlead = src->maxlead;
    return OK;
}

/* The full image of spans into img, recording each column's part. */
static int build_image(const PlanObject *plan, const Span *spans, Buf *img, Part *parts) {
    if (PUT_LIT(img, "{") != OK) return ERROR;
    for (Py_ssize_t i = 0; i < plan->ncols; i++) {
        if (i && PUT_LIT(img, ",") != OK) return ERROR;
        int r = put_column(plan, i, &spans[i], img, &parts[i]);
        if (r != OK) return r;
    }
    return PUT_LIT(img, "}");
}

/* The key image: the key columns' parts of an image, joined. */
static PyObject *key_str(const PlanObject *plan, const Buf *img, const Part *parts) {
    Buf key;
    char stack[512];
    BUF_ON(key, stack);
    PyObject *out = NULL;
    Part ignored;
    if (PUT_LIT(&key, "{") != OK) goto done;
    for (Py_ssize_t j = 0; j < plan->nkeys; j++) {
        if ((j && PUT_LIT(&key, ",") != OK) || put_part(&key, img, &parts[plan->key_idx[j]], &ignored) != OK)
            goto done;
    }
    if (PUT_LIT(&key, "}") != OK) goto done;
    out = buf_str(&key);
done:
    buf_free(&key);
    return out;
}

/* Scratch per call: spans and parts on the stack for ordinary tables. */
#define STACK_COLS 64
typedef struct {
    Span *old, *new_;
    Part *parts_old, *parts_new;
    void *heap;
    Span s_old[STACK_COLS], s_new[STACK_COLS];
    Part p_old[STACK_COLS], p_new[STACK_COLS];
} Scratch;

static int scratch_init(Scratch *s, Py_ssize_t ncols) {
    s->heap = NULL;
    if (ncols <= STACK_COLS) {
        s->old = s->s_old;
        s->new_ = s->s_new;
        s->parts_old = s->p_old;
        s->parts_new = s->p_new;
        return OK;
    }
    size_t spans = sizeof(Span) * (size_t)ncols, parts = sizeof(Part) * (size_t)ncols;
    char *m = PyMem_Malloc(2 * spans + 2 * parts);
    if (!m) {
        PyErr_NoMemory();
        return ERROR;
    }
    s->heap = m;
    s->old = (Span *)m;
    s->new_ = (Span *)(m + spans);
    s->parts_old = (Part *)(m + 2 * spans);
    s->parts_new = (Part *)(m + 2 * spans + parts);
    return OK;
}

static void scratch_free(Scratch *s) {
    PyMem_Free(s->heap);
}

/* (image, key image) of a serialized Row; Py_None when the row goes to Python. */
static PyObject *row_images(const PlanObject *plan, Scratch *s, const uint8_t *data, Py_ssize_t n) {
    Buf img;
    char stack[STACK_BUF];
    BUF_ON(img, stack);
    PyObject *out = NULL;
    int r = row_spans(plan, data, data + n, s->old);
    if (r == OK) r = build_image(plan, s->old, &img, s->parts_old);
    if (r == FALLBACK) {
        out = Py_NewRef(Py_None);
    } else if (r == OK) {
        PyObject *image = buf_str(&img), *key = image ? key_str(plan, &img, s->parts_old) : NULL;
        if (image && key) out = PyTuple_Pack(2, image, key);
        Py_XDECREF(image);
        Py_XDECREF(key);
    }
    buf_free(&img);
    return out;
}

/* Reads a serialized UpdatedRow's two rows (old = 1, new = 2, each at most once,
 * nothing else; a missing one is the empty row). */
static int updated_spans(const PlanObject *plan, const uint8_t *p, const uint8_t *end, Scratch *s) {
    const uint8_t *rows[3] = {NULL, NULL, NULL}, *ends[3] = {NULL, NULL, NULL};
    while (p < end) {
        int field = *p == BL_TAG_UPDATED_ROW_OLD ? 1 : (*p == BL_TAG_UPDATED_ROW_NEW ? 2 : 0);
        uint64_t len;
        if (!field || rows[field]) return FALLBACK;
        int k = bl_read_varint(p + 1, end, &len);
        if (!k || len > (uint64_t)(end - p - 1 - k)) return FALLBACK;
        rows[field] = p + 1 + k;
        ends[field] = rows[field] + len;
        p = ends[field];
    }
    int r = row_spans(plan, rows[1], ends[1], s->old);
    if (r != OK) return r;
    return row_spans(plan, rows[2], ends[2], s->new_);
}

/* (before, after, after's key image) of a serialized UpdatedRow; Py_None when it
 * goes to Python. A column whose datum bytes did not change reuses its text. */
static PyObject *update_images(const PlanObject *plan, Scratch *s, const uint8_t *data, Py_ssize_t n) {
    Buf before, after;
    char stack_b[STACK_BUF], stack_a[STACK_BUF];
    BUF_ON(before, stack_b);
    BUF_ON(after, stack_a);
    PyObject *out = NULL;
    int r = updated_spans(plan, data, data + n, s);
    if (r == OK) r = build_image(plan, s->old, &before, s->parts_old);
    if (r == OK) r = PUT_LIT(&after, "{");
    for (Py_ssize_t i = 0; r == OK && i < plan->ncols; i++) {
        const Span *was = &s->old[i], *now = &s->new_[i];
        if (i && (r = PUT_LIT(&after, ",")) != OK) break;
        if (was->n == now->n && (now->n == 0 || memcmp(was->p, now->p, (size_t)now->n) == 0))
            r = put_part(&after, &before, &s->parts_old[i], &s->parts_new[i]);
        else
            r = put_column(plan, i, now, &after, &s->parts_new[i]);
    }
    if (r == OK) r = PUT_LIT(&after, "}");
    if (r == FALLBACK) {
        out = Py_NewRef(Py_None);
    } else if (r == OK) {
        PyObject *b = buf_str(&before), *a = b ? buf_str(&after) : NULL;
        PyObject *key = a ? key_str(plan, &after, s->parts_new) : NULL;
        if (key) out = PyTuple_Pack(3, b, a, key);
        Py_XDECREF(b);
        Py_XDECREF(a);
        Py_XDECREF(key);
    }
    buf_free(&before);
    buf_free(&after);
    return out;
}

static PyObject *plan_images(PlanObject *self, PyObject *arg) {
    Scratch s;
    if (!PyBytes_Check(arg)) return PyErr_Format(PyExc_TypeError, "images takes bytes, got %s", Py_TYPE(arg)->tp_name);
    if (scratch_init(&s, self->ncols) != OK) return NULL;
    PyObject *out = row_images(self, &s, (const uint8_t *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    scratch_free(&s);
    return out;
}

static PyObject *plan_update_images(PlanObject *self, PyObject *arg) {
    Scratch s;
    if (!PyBytes_Check(arg))
        return PyErr_Format(PyExc_TypeError, "update_images takes bytes, got %s", Py_TYPE(arg)->tp_name);
    if (scratch_init(&s, self->ncols) != OK) return NULL;
    PyObject *out = update_images(self, &s, (const uint8_t *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    scratch_free(&s);
    return out;
}

/* One item of a mutation's row list, fetched as Python's rows[i] does (so a
 * sequence naming more rows than there are raises the very same IndexError). */
static PyObject *get_row(PyObject *rows, Py_ssize_t i) {
    PyObject *index = PyLong_FromSsize_t(i);
    if (!index) return NULL;
    PyObject *row = PyObject_GetItem(rows, index);
    Py_DECREF(index);
    return row;
}

/* ------------------------------------------------------------------ Arrow columns */
/* The images can also go straight into Arrow's string layout instead of one str
 * each: per column an int32 offsets buffer (rows + 1 entries, starting at 0), the
 * UTF-8 text back to back, and a validity bitmap (bit i set: row i is not null,
 * least significant bit first). binlake.lake.pumps.datasource wraps them with
 * pyarrow.Array.from_buffers, so the text is never turned into Python objects at
 * all (making those str and converting them back to UTF-8 for Arrow cost about as
 * much as decoding). The four columns are the change rows' op, keys, before and
 * after, in the order the rows were decoded - including rows the Python path
 * decoded, whose str are appended in place, so the row order is exact. */
enum { C_OP, C_KEYS, C_BEFORE, C_AFTER, NCOLS };

typedef struct {
    Buf data;    /* the text of every value, back to back */
    Buf offsets; /* int32 per row + 1 */
    Buf valid;   /* the validity bitmap, (rows + 7) / 8 bytes */
    Py_ssize_t nulls;
} StrCol;

typedef struct {
    PyObject_HEAD
    StrCol col[NCOLS];
    Py_ssize_t rows;
    int ready;
} ColumnsObject;

/* Where the columns stood, to undo a partly written row or mutation. */
typedef struct {
    Py_ssize_t rows;
    Py_ssize_t data[NCOLS], nulls[NCOLS];
} Mark;

/* A Buf on the heap from the start (these grow to megabytes and live long). */
static int heap_buf(Buf *b, Py_ssize_t cap) {
    b->data = PyMem_Malloc((size_t)cap);
    if (!b->data) {
        PyErr_NoMemory();
        return ERROR;
    }
    b->len = 0;
    b->cap = cap;
    b->extra = 0;
    b->maxlead = 0;
    b->heap = 1;
    return OK;
}

/* Empties a column: no rows, the single offset 0. Capacity is kept for the next batch. */
static void col_reset(StrCol *c) {
    int32_t zero = 0;
    c->data.len = 0;
    c->valid.len = 0;
    c->nulls = 0;
    memcpy(c->offsets.data, &zero, sizeof zero); /* offsets.cap >= 4 from columns_init */
    c->offsets.len = (Py_ssize_t)sizeof zero;
}

static void columns_mark(const ColumnsObject *self, Mark *m) {
    m->rows = self->rows;
    for (int i = 0; i < NCOLS; i++) {
        m->data[i] = self->col[i].data.len;
        m->nulls[i] = self->col[i].nulls;
    }
}

/* Back to a mark: every buffer's length follows from the row count (the bits of
 * the last bitmap byte above it are rewritten as rows are added, and masked out
 * by take). */
static void columns_restore(ColumnsObject *self, const Mark *m) {
    self->rows = m->rows;
    for (int i = 0; i < NCOLS; i++) {
        StrCol *c = &self->col[i];
        c->data.len = m->data[i];
        c->nulls = m->nulls[i];
        c->offsets.len = (m->rows + 1) * (Py_ssize_t)sizeof(int32_t);
        c->valid.len = (m->rows + 7) / 8;
    }
}

/* Ends row `row` of a column whose text (if any) was just appended: its end offset
 * and validity bit. int32 offsets: more than 2 GiB of text in one column of one
 * batch is refused (a batch is some thousands of rows, so this never happens in
 * practice, but it must not wrap around). */
static int col_end(StrCol *c, Py_ssize_t row, int valid) {
    if (c->data.len > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of image text in one Arrow batch");
        return ERROR;
    }
    int32_t off = (int32_t)c->data.len;
    if (buf_put(&c->offsets, (const char *)&off, sizeof off) != OK) return ERROR;
    Py_ssize_t byte = row >> 3;
    if (byte >= c->valid.len) {
        if (buf_reserve(&c->valid, 1) != OK) return ERROR;
        c->valid.data[c->valid.len++] = 0;
    }
    uint8_t bit = (uint8_t)(1u << (row & 7));
    if (valid) {
        c->valid.data[byte] |= bit;
    } else {
        c->valid.data[byte] &= (uint8_t)~bit;
        c->nulls++;
    }
    return OK;
}

/* Appends a str (its UTF-8) or None (null) to a column, as row `row`. */
static int col_put_obj(StrCol *c, Py_ssize_t row, PyObject *value) {
    if (value == Py_None) return col_end(c, row, 0);
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a change-row column value must be str or None, got %s", Py_TYPE(value)->tp_name);
        return ERROR;
    }
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(value, &n);
    if (!utf8 || buf_put(&c->data, utf8, n) != OK) return ERROR;
    return col_end(c, row, 1);
}

/* One whole row from Python objects (op, keys, before, after: str or None). */
static int columns_put_row(ColumnsObject *self, PyObject *const values[NCOLS]) {
    for (int i = 0; i < NCOLS; i++)
        if (col_put_obj(&self->col[i], self->rows, values[i]) != OK) return ERROR;
    self->rows++;
    return OK;
}

static int columns_init(ColumnsObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Columns", kwlist)) return -1;
    if (self->ready) {
        PyErr_SetString(PyExc_TypeError, "Columns is initialised once");
        return -1;
    }
    for (int i = 0; i < NCOLS; i++) {
        StrCol *c = &self->col[i];
        if (heap_buf(&c->data, 1 << 16) != OK || heap_buf(&c->offsets, 1 << 12) != OK ||
            heap_buf(&c->valid, 1 << 9) != OK)
            return -1; /* dealloc frees what was allocated */
        col_reset(c);
    }
    self->rows = 0;
    self->ready = 1;
    return 0;
}

static void columns_dealloc(ColumnsObject *self) {
    for (int i = 0; i < NCOLS; i++) {
        PyMem_Free(self->col[i].data.data);
        PyMem_Free(self->col[i].offsets.data);
        PyMem_Free(self->col[i].valid.data);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int columns_check(const ColumnsObject *self) {
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "Columns was not initialised");
        return ERROR;
    }
    return OK;
}

static Py_ssize_t columns_len(ColumnsObject *self) {
    return self->rows;
}

/* take() -> (rows, ((offsets, data, validity or None, null count) for op, keys,
 * before, after)): the buffers as bytes (one copy, no per-row object), and the
 * columns start empty again. */
static PyObject *columns_take(ColumnsObject *self, PyObject *Py_UNUSED(ignored)) {
    if (columns_check(self) != OK) return NULL;
    PyObject *cols[NCOLS] = {NULL, NULL, NULL, NULL}, *out = NULL;
    for (int i = 0; i < NCOLS; i++) {
        StrCol *c = &self->col[i];
        PyObject *valid;
        if (c->nulls) {
            valid = PyBytes_FromStringAndSize(c->valid.data, c->valid.len);
            /* the bits above the last row: zero, as Arrow writers leave them */
            if (valid && (self->rows & 7))
                PyBytes_AS_STRING(valid)[c->valid.len - 1] &= (char)((1u << (self->rows & 7)) - 1);
        } else {
            valid = Py_NewRef(Py_None); /* no nulls: Arrow needs no bitmap */
        }
        cols[i] = Py_BuildValue("(y#y#Nn)", c->offsets.data, c->offsets.len, c->data.data, c->data.len, valid,
                                c->nulls);
        if (!cols[i]) goto done;
    }
    out = Py_BuildValue("(n(OOOO))", self->rows, cols[0], cols[1], cols[2], cols[3]);
    if (out) {
        self->rows = 0;
        for (int i = 0; i < NCOLS; i++) col_reset(&self->col[i]);
    }
done:
    for (int i = 0; i < NCOLS; i++) Py_XDECREF(cols[i]);
    return out;
}

/* extend(ops, keys, befores, afters): rows decoded in Python (lists of equal
 * length, str or None), appended after the rows already there. */
static PyObject *columns_extend(ColumnsObject *self, PyObject *args) {
    PyObject *lists[NCOLS], *fast[NCOLS] = {NULL, NULL, NULL, NULL}, *out = NULL;
    Mark mark;
    if (columns_check(self) != OK) return NULL;
    if (!PyArg_ParseTuple(args, "OOOO:extend", &lists[0], &lists[1], &lists[2], &lists[3])) return NULL;
    columns_mark(self, &mark);
    for (int i = 0; i < NCOLS; i++) {
        fast[i] = PySequence_Fast(lists[i], "extend takes sequences");
        if (!fast[i]) goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast[0]);
    for (int i = 1; i < NCOLS; i++) {
        if (PySequence_Fast_GET_SIZE(fast[i]) != n) {
            PyErr_SetString(PyExc_ValueError, "extend takes four sequences of the same length");
            goto done;
        }
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *row[NCOLS];
        for (int i = 0; i < NCOLS; i++) row[i] = PySequence_Fast_GET_ITEM(fast[i], r);
        if (columns_put_row(self, row) != OK) goto done;
    }
    out = Py_NewRef(Py_None);
done:
    if (!out) columns_restore(self, &mark); /* all or nothing */
    for (int i = 0; i < NCOLS; i++) Py_XDECREF(fast[i]);
    return out;
}

static PyMethodDef columns_methods[] = {
    {"take", (PyCFunction)columns_take, METH_NOARGS,
     "take($self, /)\n--\n\n"
     "Returns (rows, ((offsets, data, validity or None, null count) of op, keys, before, after)); empties the columns."},
    {"extend", (PyCFunction)columns_extend, METH_VARARGS,
     "extend($self, ops, keys, befores, afters, /)\n--\n\nAppend rows decoded in Python (str or None)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods columns_as_sequence = {
    .sq_length = (lenfunc)columns_len,
};

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.lake.decoding._imagec.Columns",
    .tp_basicsize = sizeof(ColumnsObject),
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Columns()\n--\n\nGrowing Arrow string buffers of change rows' op, keys, before and after.",
    .tp_methods = columns_methods,
    .tp_as_sequence = &columns_as_sequence,
    .tp_init = (initproc)columns_init,
    .tp_new = PyType_GenericNew,
};

/* The key image (the key columns' parts of an image in `img`) appended to `out`. */
static int put_key(const PlanObject *plan, const Buf *img, const Part *parts, Buf *out) {
    Part ignored;
    if (PUT_LIT(out, "{") != OK) return ERROR;
    for (Py_ssize_t j = 0; j < plan->nkeys; j++) {
        if ((j && PUT_LIT(out, ",") != OK) || put_part(out, img, &parts[plan->key_idx[j]], &ignored) != OK)
            return ERROR;
    }
    return PUT_LIT(out, "}");
}

static const char *const OP_TEXT[3] = {"insert", "update", "delete"};

/* Ends a natively decoded row: op text, and the end offsets / validity of the
 * three images (null: the before of an insert, the after of a delete). */
static int end_row(ColumnsObject *self, int kind) {
    Py_ssize_t row = self->rows;
    StrCol *c = self->col;
    if (buf_put(&c[C_OP].data, OP_TEXT[kind], (Py_ssize_t)strlen(OP_TEXT[kind])) != OK ||
        col_end(&c[C_OP], row, 1) != OK || col_end(&c[C_KEYS], row, 1) != OK ||
        col_end(&c[C_BEFORE], row, kind != 0) != OK || col_end(&c[C_AFTER], row, kind != 2) != OK)
        return ERROR;
    self->rows++;
    return OK;
}

/* An insert (kind 0, image -> after) or delete (kind 2, image -> before) decoded
 * straight into the columns; FALLBACK leaves them as they were. */
static int row_into(const PlanObject *plan, Scratch *s, const uint8_t *data, Py_ssize_t n, ColumnsObject *cols,
                    int kind) {
    Buf *img = &cols->col[kind == 0 ? C_AFTER : C_BEFORE].data, *keys = &cols->col[C_KEYS].data;
    int r = row_spans(plan, data, data + n, s->old);
    if (r == OK) r = build_image(plan, s->old, img, s->parts_old);
    if (r == OK) r = put_key(plan, img, s->parts_old, keys);
    if (r == OK) r = end_row(cols, kind);
    return r;
}

/* An update decoded straight into the columns (see update_images). */
static int update_into(const PlanObject *plan, Scratch *s, const uint8_t *data, Py_ssize_t n, ColumnsObject *cols) {
    Buf *before = &cols->col[C_BEFORE].data, *after = &cols->col[C_AFTER].data;
    int r = updated_spans(plan, data, data + n, s);
    if (r == OK) r = build_image(plan, s->old, before, s->parts_old);
    if (r == OK) r = PUT_LIT(after, "{");
    for (Py_ssize_t i = 0; r == OK && i < plan->ncols; i++) {
        const Span *was = &s->old[i], *now = &s->new_[i];
        if (i && (r = PUT_LIT(after, ",")) != OK) break;
        if (was->n == now->n && (now->n == 0 || memcmp(was->p, now->p, (size_t)now->n) == 0))
            r = put_part(after, before, &s->parts_old[i], &s->parts_new[i]);
        else
            r = put_column(plan, i, now, after, &s->parts_new[i]);
    }
    if (r == OK) r = PUT_LIT(after, "}");
    if (r == OK) r = put_key(plan, after, s->parts_new, &cols->col[C_KEYS].data);
    if (r == OK) r = end_row(cols, 1);
    return r;
}

/* mutation_into(columns, sequence, inserted, updated, deleted, fallback) -> rows added
 *
 * What mutation does, appending to a Columns instead of returning lists: each row
 * decoded natively into the buffers, or - when this module does not answer for it -
 * by fallback.images / update_images, whose str are appended at the same place, so
 * the rows keep the sequence order. On an exception none of this mutation's rows
 * stay (the columns are as before the call). */
static PyObject *plan_mutation_into(PlanObject *self, PyObject *args) {
    PyObject *cols_obj, *sequence, *lists[3], *fallback;
    if (!PyArg_ParseTuple(args, "OOOOOO:mutation_into", &cols_obj, &sequence, &lists[0], &lists[1], &lists[2],
                          &fallback))
        return NULL;
    if (!PyObject_TypeCheck(cols_obj, &ColumnsType))
        return PyErr_Format(PyExc_TypeError, "mutation_into takes a Columns, got %s", Py_TYPE(cols_obj)->tp_name);
    ColumnsObject *cols = (ColumnsObject *)cols_obj;
    if (columns_check(cols) != OK) return NULL;
    PyObject *it = NULL, *kind_obj = NULL, *row = NULL, *res = NULL, *out = NULL;
    Py_ssize_t next[3] = {0, 0, 0};
    Mark start, at_row;
    Scratch s;
    int have_scratch = 0;
    columns_mark(cols, &start);
    if (scratch_init(&s, self->ncols) != OK) goto done;
    have_scratch = 1;
    it = PyObject_GetIter(sequence);
    if (!it) goto done;
    while ((kind_obj = PyIter_Next(it)) != NULL) {
        long kind = PyLong_Check(kind_obj) ? PyLong_AsLong(kind_obj) : -1;
        if (kind == -1 && PyErr_Occurred()) PyErr_Clear();
        if (kind < 0 || kind > 2) {
            /* unknown mutation type: the Python plan raises the error it always raised */
            PyObject *r = PyObject_CallMethod(fallback, "unknown_kind", "O", kind_obj);
            if (r) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_SystemError, "unknown_kind returned instead of raising");
            }
            goto done;
        }
        Py_CLEAR(kind_obj);
        row = get_row(lists[kind], next[kind]++);
        if (!row) goto done;
        int r = FALLBACK;
        if (PyBytes_Check(row)) {
            const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(row);
            Py_ssize_t n = PyBytes_GET_SIZE(row);
            columns_mark(cols, &at_row);
            r = kind == 1 ? update_into(self, &s, data, n, cols) : row_into(self, &s, data, n, cols, (int)kind);
            if (r == ERROR) goto done;
            if (r == FALLBACK) columns_restore(cols, &at_row); /* drop the partial text */
        }
        if (r == FALLBACK) {
            res = PyObject_CallMethod(fallback, kind == 1 ? "update_images" : "images", "O", row);
            if (!res) goto done;
            if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != (kind == 1 ? 3 : 2)) {
                PyErr_SetString(PyExc_SystemError, "the Python plan returned an unexpected shape");
                goto done;
            }
            PyObject *values[NCOLS];
            values[C_OP] = kind == 0 ? OP_INSERT : (kind == 1 ? OP_UPDATE : OP_DELETE);
            if (kind == 0) { /* insert: (after, key) */
                values[C_KEYS] = PyTuple_GET_ITEM(res, 1);
                values[C_BEFORE] = Py_None;
                values[C_AFTER] = PyTuple_GET_ITEM(res, 0);
            } else if (kind == 1) { /* update: (before, after, key) */
                values[C_KEYS] = PyTuple_GET_ITEM(res, 2);
                values[C_BEFORE] = PyTuple_GET_ITEM(res, 0);
                values[C_AFTER] = PyTuple_GET_ITEM(res, 1);
            } else { /* delete: (before, key) */
                values[C_KEYS] = PyTuple_GET_ITEM(res, 1);
                values[C_BEFORE] = PyTuple_GET_ITEM(res, 0);
                values[C_AFTER] = Py_None;
            }
            if (columns_put_row(cols, values) != OK) goto done;
            Py_CLEAR(res);
        }
        Py_CLEAR(row);
    }
    if (PyErr_Occurred()) goto done;
    out = PyLong_FromSsize_t(cols->rows - start.rows);
done:
    if (!out) columns_restore(cols, &start); /* none of this mutation's rows on an error */
    if (have_scratch) scratch_free(&s);
    Py_XDECREF(it);
    Py_XDECREF(kind_obj);
    Py_XDECREF(row);
    Py_XDECREF(res);
    return out;
}

static PyMethodDef plan_methods[] = {
    {"images", (PyCFunction)plan_images, METH_O,
     "images($self, row, /)\n--\n\nReturns (image, key image), or None when the Python path must decode the row."},
    {"update_images", (PyCFunction)plan_update_images, METH_O,
     "update_images($self, data, /)\n--\n\nReturns (before, after, key image), or None when the Python path must decode it."},
    {"mutation_into", (PyCFunction)plan_mutation_into, METH_VARARGS,
     "mutation_into($self, columns, sequence, inserted, updated, deleted, fallback, /)\n--\n\n"
     "Returns the number of rows appended to columns."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.lake.decoding._imagec.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(cols, key_idx)\n--\n\nOne table definition's image plan (see binlake.lake.image.TablePlan).",
    .tp_methods = plan_methods,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "binlake.lake.decoding._imagec",
    .m_doc = "Native image JSON for binlake.lake.decode (exactly the Python path's output, or no answer).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__imagec(void) {
    init_tables();
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ColumnsType) < 0) return NULL;
    OP_INSERT = PyUnicode_InternFromString("insert");
    OP_UPDATE = PyUnicode_InternFromString("update");
    OP_DELETE = PyUnicode_InternFromString("delete");
    if (!OP_INSERT || !OP_UPDATE || !OP_DELETE) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddObjectRef(m, "Columns", (PyObject *)&ColumnsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
