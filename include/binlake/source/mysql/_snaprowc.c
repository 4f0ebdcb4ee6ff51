/*
 * binlake.source.mysql._snaprowc - native encoder for the rows of the initial
 * snapshot's SELECT (text protocol, character_set_results = binary): each
 * result-row packet straight into the serialized binlake Row (binlog.proto
 * Row) the snapshot puts into its TableMutations.
 *
 * THE CONTRACT: exact equality with the pure-Python path, or no answer.
 *
 *   For every batch of row packets, the list of bytes this module returns is
 *   byte for byte what the Python path (PyMySQL's row parser and converters,
 *   snapshot.as_binlog_value, then values.RowEncoder) produces for the same
 *   packets. Whenever a packet holds anything this code does not reproduce
 *   exactly - a NULL in a column that may not be NULL, text that is not valid
 *   UTF-8, a number, date or datetime not in the form the server prints for a
 *   value binlake carries (a zero date, a DECIMAL that Python would print in
 *   exponent form, an integer out of range), another number of columns, a
 *   truncated packet - rows() returns None and the *whole batch* goes to the
 *   Python path, which gives the value or raises the error it always raised.
 *   Column types this module does not encode at all (SET, BIT, TIME, JSON,
 *   charsets other than UTF-8 and ASCII) never get a plan (snapshot.text_plan returns
 *   None), so their tables always take the Python path.
 *
 * Why native: PyMySQL parses a row in Python (a call per column, an int(),
 * Decimal or datetime per value), then binlake builds a dict per row and a
 * protobuf message per column: about 45 us a row on the benchmark's 12-column
 * table, against a few here.
 *
 * The API (snapshot.py builds the plan from the tracked table definition):
 *   Plan(cols)     cols: [(op, column id, nullable, a)] in column order
 *   plan.rows(packets)  packets: the payloads of the result-row packets
 *                  -> [serialized Row] or None (ask Python)
 *
 * Text-protocol row (MySQL client/server protocol, ProtocolText::ResultsetRow):
 *   per column a length-encoded string: 0xFB = NULL; a first byte below 0xFB
 *   is the length; 0xFC, 0xFD, 0xFE: a 2-, 3-, 8-byte little-endian length.
 *
 * Wire format written (as _rowsc.c; the tags are binlake_tags.h's):
 *   Row     = { 0x0A len Column }*
 *   Column  = [0x08 varint(id)] (omitted for id 0) 0x12 len Datum
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binlake_native.h"

enum {
    T_INT = 1,      /* signed decimal text -> int_value */
    T_UINT = 2,     /* unsigned decimal text -> uint_value */
    T_FLOAT = 3,    /* a: 1 = FLOAT (values._float32 of float(text)), 0 = DOUBLE */
    T_DECIMAL = 4,  /* str(Decimal(text)) == text, else declined */
    T_STRING = 5,   /* UTF-8 text (CHAR, VARCHAR, TEXT, ENUM) -> string_value; a: 1 = ASCII only */
    T_BYTES = 6,    /* a: BINARY(a) pads with NULs to a bytes; 0 = as is */
    T_DATE = 7,     /* "YYYY-MM-DD" */
    T_DATETIME = 8, /* "YYYY-MM-DD HH:MM:SS[.f]" (DATETIME, TIMESTAMP in UTC) */
};

typedef struct {
    int op;
    int64_t cid;
    int nullable;
    Py_ssize_t a;
} Col;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Col *cols;
} PlanObject;

/* One non-NULL value's text -> its Datum in d. Returns 1, 0 (ask Python) or -1 (error set). */
static int encode_value(const Col *c, const unsigned char *s, size_t n, BlBuf *d) {
    switch (c->op) {
    case T_INT:
    case T_UINT:
        return bl_int_text_datum(d, s, n, c->op == T_UINT);
    case T_FLOAT: {
        double v, out;
        if (bl_parse_double(s, n, &v) < 0) return 0;
        out = v;
        if (c->a && bl_float32_shortest(v, &out) < 0) return 0;
        return bl_float_datum(d, out) < 0 ? -1 : 1;
    }
    case T_DECIMAL:
        if (!bl_decimal_plain(s, n)) return 0;
        return bl_field(d, BL_TAG_DATUM_DECIMAL_VALUE, s, n) < 0 ? -1 : 1;
    case T_STRING:
        if (c->a) {
            for (size_t i = 0; i < n; i++)
                if (s[i] >= 0x80) return 0; /* the ascii codec refuses it: Python says how */
        } else if (!bl_utf8_valid(s, n)) {
            return 0;
        }
        return bl_field(d, BL_TAG_DATUM_STRING_VALUE, s, n) < 0 ? -1 : 1;
    case T_BYTES: {
        size_t len = n < (size_t)c->a ? (size_t)c->a : n;
        if (bl_byte(d, BL_TAG_DATUM_BYTES_VALUE) < 0 || bl_varint(d, len) < 0 || bl_reserve(d, len) < 0) return -1;
        memcpy(d->p + d->len, s, n);
        memset(d->p + d->len + n, 0, len - n);
        d->len += len;
        return 1;
    }
    case T_DATE: {
        int64_t days, year;
        if (bl_parse_date(s, n, &days, &year) < 0) return 0;
        return bl_tagged_varint(d, BL_TAG_DATUM_DATE_MICROS, bl_zigzag(days * BL_DAY_US)) < 0 ? -1 : 1;
    }
    case T_DATETIME: {
        int64_t us, year;
        ptrdiff_t k = bl_parse_datetime(s, n, &us, &year);
        if (k < 0 || (size_t)k != n) return 0;
        return bl_tagged_varint(d, BL_TAG_DATUM_DATETIME_MICROS, bl_zigzag(us)) < 0 ? -1 : 1;
    }
    }
    return 0;
}

/* One row packet -> its serialized Row in r. Returns 1, 0 (ask Python) or -1. */
static int encode_row(const PlanObject *pl, const unsigned char *p, const unsigned char *end, BlBuf *r, BlBuf *d) {
    r->len = 0;
    for (Py_ssize_t i = 0; i < pl->ncols; i++) {
        const Col *c = &pl->cols[i];
        if (p >= end) return 0;
        unsigned char first = *p++;
        d->len = 0;
        if (first == 0xFB) {
            if (!c->nullable) return 0;
            if (bl_tagged_varint(d, BL_TAG_DATUM_IS_NULL, 1) < 0) return -1;
        } else {
            uint64_t len;
            if (first < 0xFB) {
                len = first;
            } else {
                int w = first == 0xFC ? 2 : first == 0xFD ? 3 : first == 0xFE ? 8 : 0;
                if (w == 0 || end - p < w) return 0;
                len = bl_le(p, w);
                p += w;
            }
            if (len > (uint64_t)(end - p)) return 0;
            int rc = encode_value(c, p, (size_t)len, d);
            if (rc <= 0) return rc;
            p += len;
        }
        if (bl_row_column(r, c->cid, d) < 0) return -1;
    }
    return p == end ? 1 : 0;
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
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iLpn", &cs[i].op, &cid, &cs[i].nullable, &cs[i].a)) {
            PyMem_Free(cs);
            Py_DECREF(seq);
            return -1;
        }
        cs[i].cid = cid;
        if (cs[i].op < T_INT || cs[i].op > T_DATETIME || cs[i].a < 0 || cs[i].a > (1 << 24)) {
            PyErr_Format(PyExc_ValueError, "column %zd: invalid entry (op %d, a %zd)", i, cs[i].op, cs[i].a);
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

static PyObject *Plan_rows(PlanObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "packets must be a sequence of bytes");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n), *result = NULL;
    BlBuf r = {0}, d = {0};
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        char *buf;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(item, &buf, &len) < 0) goto done;
        const unsigned char *p = (const unsigned char *)buf;
        int rc = encode_row(self, p, p + len, &r, &d);
        if (rc < 0) goto done;
        if (rc == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *row = PyBytes_FromStringAndSize(r.p ? (const char *)r.p : "", r.len);
        if (!row) goto done;
        PyList_SET_ITEM(out, i, row);
    }
    result = Py_NewRef(out);
done:
    Py_XDECREF(out);
    Py_DECREF(seq);
    PyMem_Free(r.p);
    PyMem_Free(d.p);
    return result;
}

static PyObject *Plan_len(PlanObject *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSsize_t(self->ncols); }

static PyMethodDef Plan_methods[] = {
    {"rows", (PyCFunction)Plan_rows, METH_O,
     "rows($self, packets, /)\n--\n\nReturns [serialized Row] for the row packets' payloads, or None (ask Python)"},
    {"columns", (PyCFunction)Plan_len, METH_NOARGS, "columns($self, /)\n--\n\nThe number of columns in the plan."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.source.mysql._snaprowc.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(cols)\n--\n\nA table version's snapshot row plan (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

/*
 * frames(buf, pos, max_rows) -> (payloads, next_pos, status)
 *
 * Splits the MySQL packets of a result set's rows out of bytes read from the
 * connection (buf, from offset pos): at most max_rows row payloads, each the
 * concatenation of its packets (a payload of 2^24-1 bytes continues in the next
 * packet). It stops before a packet (or a chain of them) not yet whole in buf.
 * status: FRAMES_FULL (max_rows payloads taken), FRAMES_MORE (buf ends inside
 * a packet: read more and call again from next_pos), FRAMES_EOF (the result's
 * EOF packet ended the rows: next_pos is just past it), FRAMES_ERROR (an error
 * packet starts at next_pos; its payload is the last item of payloads, not a
 * row). Why: PyMySQL reads each row packet with two buffered reads and an
 * object in Python, 3-4 us a row, the largest cost of the snapshot's reading.
 */
enum { FRAMES_FULL = 0, FRAMES_MORE = 1, FRAMES_EOF = 2, FRAMES_ERROR = 3 };
#define MAX_PACKET 0xFFFFFF

static PyObject *frames(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_rows;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &pos, &max_rows)) return NULL;
    PyObject *out = PyList_New(0), *result = NULL;
    if (!out) goto done;
    if (pos < 0 || pos > view.len || max_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "frames: pos must be within buf and max_rows at least 1");
        goto done;
    }
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t size = view.len;
    int status = FRAMES_MORE;
    while (PyList_GET_SIZE(out) < max_rows) {
        /* The chain of packets of one payload: its total length, if whole in buf. */
        Py_ssize_t at = pos, total = 0;
        int whole = 0;
        for (;;) {
            if (size - at < 4) break;
            Py_ssize_t len = (Py_ssize_t)b[at] | ((Py_ssize_t)b[at + 1] << 8) | ((Py_ssize_t)b[at + 2] << 16);
            if (size - at - 4 < len) break;
            total += len;
            at += 4 + len;
            if (len < MAX_PACKET) {
                whole = 1;
                break;
            }
        }
        if (!whole) break;
        PyObject *payload = PyBytes_FromStringAndSize(NULL, total);
        if (!payload) goto done;
        char *dst = PyBytes_AS_STRING(payload);
        for (Py_ssize_t q = pos; q < at;) {
            Py_ssize_t len = (Py_ssize_t)b[q] | ((Py_ssize_t)b[q + 1] << 8) | ((Py_ssize_t)b[q + 2] << 16);
            memcpy(dst, b + q + 4, (size_t)len);
            dst += len;
            q += 4 + len;
        }
        const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(payload);
        if (total > 0 && d[0] == 0xFF) {
            status = FRAMES_ERROR;
        } else if (total > 0 && total < 9 && d[0] == 0xFE) {
            Py_DECREF(payload);
            pos = at;
            status = FRAMES_EOF;
            break;
        }
        int rc = PyList_Append(out, payload);
        Py_DECREF(payload);
        if (rc < 0) goto done;
        if (status == FRAMES_ERROR) break;
        pos = at;
    }
    if (status == FRAMES_MORE && PyList_GET_SIZE(out) >= max_rows) status = FRAMES_FULL;
    result = Py_BuildValue("(Oni)", out, pos, status);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef module_methods[] = {
    {"frames", frames, METH_VARARGS,
     "frames(buf, pos, max_rows, /)\n--\n\nRow payloads split out of a result set's packets: "
     "(payloads, next_pos, status); see the C source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef snaprowc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_snaprowc",
    .m_doc = "Native encoder of the initial snapshot's text-protocol rows into binlake Rows.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__snaprowc(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&snaprowc_module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "FRAMES_FULL", FRAMES_FULL) < 0 ||
        PyModule_AddIntConstant(m, "FRAMES_MORE", FRAMES_MORE) < 0 ||
        PyModule_AddIntConstant(m, "FRAMES_EOF", FRAMES_EOF) < 0 ||
        PyModule_AddIntConstant(m, "FRAMES_ERROR", FRAMES_ERROR) < 0 ||
        PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
