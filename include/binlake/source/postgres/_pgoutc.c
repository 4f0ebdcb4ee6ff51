/*
 * binlake.source.postgres._pgoutc - native decoder for the tuples of pgoutput's
 * INSERT/UPDATE/DELETE messages (protocol version 1, text format): the
 * column texts straight into the serialized binlake Rows (binlog.proto Row /
 * UpdatedRow) the PostgreSQL source puts into its TableMutations.
 *
 * THE CONTRACT: exact equality with the pure-Python path, or no answer.
 *
 *   For every tuple, the bytes returned are byte for byte what the Python path
 *   (source.postgres.source._Reader.tuple_data, values.decode_row, then
 *   codec.encode_row / encode_update against the table version's TableInfo)
 *   produces. Whenever a tuple holds anything this code does not reproduce
 *   exactly - a NULL in a NOT NULL column, an unchanged TOAST value ('u'), a
 *   binary-format value, text that is not strict UTF-8, a number, date or time
 *   not in the canonical form PostgreSQL prints (infinity, NaN, BC dates, a
 *   year past 9999, a DECIMAL that Python would print in exponent form, an
 *   hour 24, a zone offset other than +HH or +HH:MM), a column count that is
 *   not the table's, a truncated message - the call returns None and the
 *   Python path reads the same tuple from the same offset, giving the value or
 *   raising the error it always raised. JSON columns get no plan
 *   (pgplan.build_plan returns None): their tables always take the Python path.
 *
 * Why native: the Python path makes a bytes object and a str per column, a
 * Python value per column (int(), Decimal, datetime.fromisoformat), a dict
 * per row and a protobuf message per column; here it is one pass over the
 * message's bytes.
 *
 * The API (pgplan.py builds the plan from the table version):
 *   Plan(cols)       cols: [(kind, column id, nullable)] in column order
 *   plan.row(data, offset)     -> (serialized Row, offset after the tuple) or None
 *   plan.update(data, offset)  -> (serialized UpdatedRow, offset after both tuples) or None
 *                                 (offset: the old tuple; the 'N' byte and the new tuple follow)
 *   plan.copy_rows(data)       -> [serialized Row] or None: whole lines of COPY ... TO STDOUT
 *                                 (text format), which the initial snapshot reads; the same
 *                                 contract against the Python path's rows for those lines
 *                                 (snapshot.copy_line_texts, then values.decode_row)
 *
 * Wire format written (what the upb serializer writes, as _rowsc.c; the tags are
 * binlake_tags.h's):
 *   Row        = { 0x0A len Column }*
 *   Column     = [0x08 varint(id)] (omitted for id 0) 0x12 len Datum
 *   Datum      = is_null 0x08 01, int 0x10 zigzag, uint 0x18, float 0x21 fixed64,
 *                decimal 0x2A, string 0x32, bytes 0x3A, date 0x40 zigzag,
 *                datetime 0x48 zigzag, time 0x50 zigzag
 *   UpdatedRow = 0x0A len Row(old) 0x12 len Row(new)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "binlake_native.h"

enum {
    K_INT = 1,      /* int2/int4/int8 */
    K_UINT = 2,     /* oid */
    K_BOOL = 3,
    K_FLOAT = 4,    /* float4/float8: float(text) as a double */
    K_DECIMAL = 5,  /* numeric: str(Decimal(text)) */
    K_STRING = 6,
    K_BYTES = 7,    /* bytea, hex output */
    K_DATE = 8,
    K_TIMESTAMP = 9,   /* timestamp without time zone */
    K_TIMESTAMPTZ = 10, /* timestamptz (UTC session: +00), to naive UTC */
    K_TIME = 11,
};

typedef struct {
    int kind;
    int64_t cid;
    int nullable;
} Col;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Col *cols;
} PlanObject;

/* ------------------------------------------------------------------ values */

/* One column's text -> its Datum in d. Returns 1, 0 (ask Python) or -1 (error set). */
static int encode_text(const Col *c, const unsigned char *s, size_t n, BlBuf *d) {
    switch (c->kind) {
    case K_INT:
    case K_UINT:
        return bl_int_text_datum(d, s, n, c->kind == K_UINT);
    case K_BOOL:
        /* Python: text == "t" (anything else is False, but not all of it is text) */
        if (n != 1 || (s[0] != 't' && s[0] != 'f')) return 0;
        return bl_tagged_varint(d, BL_TAG_DATUM_INT_VALUE, s[0] == 't' ? 2 : 0) < 0 ? -1 : 1;
    case K_FLOAT: {
        double v;
        if (bl_parse_double(s, n, &v) < 0) return 0;
        return bl_float_datum(d, v) < 0 ? -1 : 1;
    }
    case K_DECIMAL:
        if (!bl_decimal_plain(s, n)) return 0;
        return bl_field(d, BL_TAG_DATUM_DECIMAL_VALUE, s, n) < 0 ? -1 : 1;
    case K_STRING:
        if (!bl_utf8_valid(s, n)) return 0;
        return bl_field(d, BL_TAG_DATUM_STRING_VALUE, s, n) < 0 ? -1 : 1;
    case K_BYTES: {
        if (!bl_utf8_valid(s, n)) return 0;
        if (n >= 2 && s[0] == '\\' && s[1] == 'x') {
            size_t m = n - 2;
            if (m % 2) return 0;
            if (bl_byte(d, BL_TAG_DATUM_BYTES_VALUE) < 0 || bl_varint(d, m / 2) < 0 || bl_reserve(d, m / 2) < 0) return -1;
            for (size_t i = 2; i < n; i += 2) {
                int hv[2];
                for (int k = 0; k < 2; k++) {
                    unsigned char h = s[i + k];
                    hv[k] = bl_is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                          : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                    if (hv[k] < 0) return 0;
                }
                d->p[d->len++] = (unsigned char)(hv[0] * 16 + hv[1]);
            }
            return 1;
        }
        return bl_field(d, BL_TAG_DATUM_BYTES_VALUE, s, n) < 0 ? -1 : 1;
    }
    case K_DATE: {
        int64_t days, year;
        if (bl_parse_date(s, n, &days, &year) < 0) return 0;
        return bl_tagged_varint(d, BL_TAG_DATUM_DATE_MICROS, bl_zigzag(days * BL_DAY_US)) < 0 ? -1 : 1;
    }
    case K_TIMESTAMP:
    case K_TIMESTAMPTZ: {
        int64_t year, us;
        ptrdiff_t t = bl_parse_datetime(s, n, &us, &year);
        if (t < 0) return 0;
        size_t i = (size_t)t;
        int64_t off = 0;
        if (c->kind == K_TIMESTAMPTZ) {
            /* +HH or +HH:MM; Python's astimezone may leave years 1..9999 at the edges: ask it there */
            if (year <= 1 || year >= 9999) return 0;
            if (i + 3 != n && i + 6 != n) return 0;
            if (s[i] != '+' && s[i] != '-') return 0;
            int64_t oh = bl_digits(s + i + 1, 2), om = 0;
            if (oh < 0 || oh > 23) return 0;
            if (i + 6 == n) {
                if (s[i + 3] != ':') return 0;
                om = bl_digits(s + i + 4, 2);
                if (om < 0 || om > 59) return 0;
            }
            off = (oh * 3600 + om * 60) * 1000000LL;
            if (s[i] == '-') off = -off;
        } else if (i != n) {
            return 0;
        }
        int64_t v = us - off;
        return bl_tagged_varint(d, BL_TAG_DATUM_DATETIME_MICROS, bl_zigzag(v)) < 0 ? -1 : 1;
    }
    case K_TIME: {
        int64_t us;
        ptrdiff_t t = bl_parse_time(s, n, &us);
        if (t < 0 || (size_t)t != n) return 0;
        return bl_tagged_varint(d, BL_TAG_DATUM_TIME_MICROS, bl_zigzag(us)) < 0 ? -1 : 1;
    }
    }
    return 0;
}

/* One TupleData at *pp: Int16 count, then per column 'n' | 'u' | 't' Int32 len text.
   Appends the serialized Row to r. Returns 1, 0 (ask Python) or -1. */
static int decode_tuple(const PlanObject *pl, const unsigned char **pp, const unsigned char *end, BlBuf *r, BlBuf *d) {
    const unsigned char *p = *pp;
    if (end - p < 2) return 0;
    Py_ssize_t n = (Py_ssize_t)(((unsigned)p[0] << 8) | p[1]);
    p += 2;
    if (n != pl->ncols) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Col *c = &pl->cols[i];
        if (p >= end) return 0;
        unsigned char k = *p++;
        d->len = 0;
        if (k == 'n') {
            if (!c->nullable) return 0;
            if (bl_tagged_varint(d, BL_TAG_DATUM_IS_NULL, 1) < 0) return -1;
        } else if (k == 't') {
            if (end - p < 4) return 0;
            uint32_t len = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
            p += 4;
            if (len > (uint32_t)INT32_MAX || (size_t)(end - p) < len) return 0;
            int rc = encode_text(c, p, len, d);
            if (rc <= 0) return rc;
            p += len;
        } else {
            return 0; /* 'u' (unchanged TOAST) or a binary value: Python says what it means */
        }
        if (bl_row_column(r, c->cid, d) < 0) return -1;
    }
    *pp = p;
    return 1;
}

/* ------------------------------------------------------------------ Plan */

static void Plan_dealloc(PlanObject *self) {
    PyMem_Free(self->cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    PyObject *cols;
    static char *kwlist[] = {"cols", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &cols)) return -1;
    PyObject *seq = PySequence_Fast(cols, "cols must be a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Col *cs = PyMem_Calloc(n ? n : 1, sizeof(Col));
    if (!cs) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long cid;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iLp", &cs[i].kind, &cid, &cs[i].nullable)) {
            PyMem_Free(cs);
            Py_DECREF(seq);
            return -1;
        }
        cs[i].cid = cid;
        if (cs[i].kind < K_INT || cs[i].kind > K_TIME) {
            PyErr_Format(PyExc_ValueError, "column %zd: invalid kind %d", i, cs[i].kind);
            PyMem_Free(cs);
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    PyMem_Free(self->cols);
    self->cols = cs;
    self->ncols = n;
    return 0;
}

/* (data, offset) -> (bytes, offset after) or None; update: old tuple, 'N', new tuple. */
static PyObject *decode(PlanObject *self, PyObject *args, int update) {
    Py_buffer data;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "y*n", &data, &offset)) return NULL;
    PyObject *result = NULL;
    BlBuf r1 = {0}, r2 = {0}, d = {0}, u = {0};
    if (offset < 0 || offset > data.len) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const unsigned char *p = (const unsigned char *)data.buf + offset, *end = (const unsigned char *)data.buf + data.len;
    int rc = decode_tuple(self, &p, end, &r1, &d);
    if (rc > 0 && update) {
        if (p >= end || *p != 'N') {
            rc = 0;
        } else {
            p++;
            rc = decode_tuple(self, &p, end, &r2, &d);
        }
    }
    if (rc < 0) goto done;
    if (rc == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *bytes;
    if (update) {
        if (bl_updated_row(&u, &r1, &r2) < 0) goto done;
        bytes = PyBytes_FromStringAndSize((const char *)u.p, u.len);
    } else {
        bytes = PyBytes_FromStringAndSize(r1.p ? (const char *)r1.p : "", r1.len);
    }
    if (!bytes) goto done;
    result = Py_BuildValue("(Nn)", bytes, (Py_ssize_t)(p - (const unsigned char *)data.buf));
done:
    PyMem_Free(r1.p);
    PyMem_Free(r2.p);
    PyMem_Free(d.p);
    PyMem_Free(u.p);
    PyBuffer_Release(&data);
    return result;
}

/* One field of a COPY text-format line, s[0:n], unescaped into u (COPY TO's escapes:
   \b \f \n \r \t \v, \\, \NNN octal, \xHH hex, and a backslash before any other
   character is that character, as COPY FROM reads them). -1 with MemoryError set. */
static int copy_unescape(const unsigned char *s, size_t n, BlBuf *u) {
    u->len = 0;
    if (bl_reserve(u, n + 1) < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (ch != '\\' || i + 1 >= n) { u->p[u->len++] = ch; continue; }
        ch = s[++i];
        if (ch >= '0' && ch <= '7') {
            int v = ch - '0';
            for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) v = v * 8 + (s[++i] - '0');
            u->p[u->len++] = (unsigned char)v;
            continue;
        }
        if (ch == 'x' && i + 1 < n && isxdigit(s[i + 1])) {
            int v = 0;
            for (int k = 0; k < 2 && i + 1 < n && isxdigit(s[i + 1]); k++) {
                unsigned char h = s[++i];
                v = v * 16 + (bl_is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            u->p[u->len++] = (unsigned char)v;
            continue;
        }
        switch (ch) {
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'v': ch = '\v'; break;
        default: break;
        }
        u->p[u->len++] = ch;
    }
    return 0;
}

/* copy_rows(data) -> [serialized Row] or None: data is whole lines of
   COPY (SELECT the table's columns) TO STDOUT in text format (fields split by tabs,
   \N for NULL, each line ending in a newline). Each field is the same text the
   tuple of a pgoutput message carries for it, so it is encoded as in decode_tuple;
   anything declined there, a line with another number of fields, or data that does
   not end a line declines the whole call. */
static PyObject *Plan_copy_rows(PlanObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyList_New(0), *result = NULL;
    BlBuf r = {0}, d = {0}, u = {0};
    if (!out) goto done;
    const unsigned char *p = (const unsigned char *)data.buf, *end = p + data.len;
    while (p < end) {
        const unsigned char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) goto decline;
        r.len = 0;
        Py_ssize_t i = 0;
        const unsigned char *f = p;
        for (;;) {
            const unsigned char *tab = memchr(f, '\t', (size_t)(eol - f));
            const unsigned char *fe = tab ? tab : eol;
            if (i >= self->ncols) goto decline;
            const Col *c = &self->cols[i++];
            d.len = 0;
            if (fe - f == 2 && f[0] == '\\' && f[1] == 'N') {
                if (!c->nullable) goto decline;
                if (bl_tagged_varint(&d, BL_TAG_DATUM_IS_NULL, 1) < 0) goto done;
            } else {
                if (copy_unescape(f, (size_t)(fe - f), &u) < 0) goto done;
                int rc = encode_text(c, u.p, u.len, &d);
                if (rc < 0) goto done;
                if (rc == 0) goto decline;
            }
            if (bl_row_column(&r, c->cid, &d) < 0) goto done;
            if (!tab) break;
            f = tab + 1;
        }
        if (i != self->ncols) goto decline;
        PyObject *row = PyBytes_FromStringAndSize(r.p ? (const char *)r.p : "", r.len);
        if (!row) goto done;
        int bad = PyList_Append(out, row);
        Py_DECREF(row);
        if (bad < 0) goto done;
        p = eol + 1;
    }
    result = Py_NewRef(out);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    PyMem_Free(r.p);
    PyMem_Free(d.p);
    PyMem_Free(u.p);
    PyBuffer_Release(&data);
    return result;
}

static PyObject *Plan_row(PlanObject *self, PyObject *args) { return decode(self, args, 0); }
static PyObject *Plan_update(PlanObject *self, PyObject *args) { return decode(self, args, 1); }
static PyObject *Plan_len(PlanObject *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSsize_t(self->ncols); }

static PyMethodDef Plan_methods[] = {
    {"row", (PyCFunction)Plan_row, METH_VARARGS, "row($self, data, offset, /)\n--\n\nReturns (serialized Row, offset after) or None"},
    {"update", (PyCFunction)Plan_update, METH_VARARGS,
     "update($self, data, offset, /)\n--\n\nReturns (serialized UpdatedRow, offset after the new tuple) or None"},
    {"copy_rows", (PyCFunction)Plan_copy_rows, METH_O,
     "copy_rows($self, data, /)\n--\n\nReturns [serialized Row] for whole COPY text lines, or None"},
    {"columns", (PyCFunction)Plan_len, METH_NOARGS, "columns($self, /)\n--\n\nThe number of columns in the plan."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.source.postgres._pgoutc.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(cols)\n--\n\nA table version's pgoutput tuple plan (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

static struct PyModuleDef pgoutc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_pgoutc",
    .m_doc = "Native decoder of pgoutput tuples into binlake Rows.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__pgoutc(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&pgoutc_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
