/*
 * binlake.source.mysql._framec - native framing of the MySQL/MariaDB
 * replication stream: the bytes a replica connection receives after
 * COM_BINLOG_DUMP (or its GTID form) cut into protocol packets, event headers
 * decoded, CRC32 checksums verified, and the events the source handles on
 * every transaction (GTID, QUERY, TABLE_MAP, WRITE/UPDATE/DELETE_ROWS v1/v2,
 * XID, ROTATE, heartbeats) reduced to tuples of their fields.
 *
 * Why native: mysql-replication frames each packet and event in Python (a
 * packet object, a wrapper, an event object, several struct.unpack calls per
 * event); measured on `binlake bench source` that was ~45 % of the source's
 * CPU at six events per small transaction. Here it is one pass over the bytes
 * per chunk read from the socket.
 *
 * THE CONTRACT: the fields are exactly what mysql-replication 1.0 reads for
 * the same event (framing.py turns them into the same values the source took
 * from its event objects); anything this code does not read the same way -
 * a post-header length the FORMAT_DESCRIPTION declares other than the known
 * one, v2 rows events with extra row info, a NULL column count, an event whose
 * size disagrees with its packet, every other event type the source looks at
 * (FORMAT_DESCRIPTION) - comes back RAW: its whole packet, which framing.py
 * hands to mysql-replication as its own reader would have. Event types the
 * source ignores are dropped here, as mysql-replication's only_events drops
 * them.
 *
 * API:
 *   Framer(checksum)          checksum: the events end in a CRC32 (binlog_checksum=CRC32)
 *   framer.set_post_header(b) the FORMAT_DESCRIPTION's post-header lengths (index type-1)
 *   framer.feed(data) -> [event tuple], consuming every complete packet; the rest waits
 *                        for the next feed. Tuples (ts: header timestamp, pos: header log_pos):
 *     (2, ts, pos, schema: bytes, query: bytes)                         QUERY
 *     (4, ts, pos, position: int, next_binlog: bytes)                   ROTATE
 *     (16, ts, pos) XID    (27, ts, pos) HEARTBEAT    (33|162, ts, pos) GTID (MySQL|MariaDB)
 *     (19, ts, pos, table_id, body: bytes, packet: bytes)               TABLE_MAP
 *     (type, ts, pos, table_id, packet, start, end, ncols, bitmap1, bitmap2|None)
 *                          rows (23-25, 30-32): the row images are packet[start:end]
 *     (-1,) EOF packet   (-2, packet) error packet   (-3, type, pos) checksum mismatch
 *     (-4, type, ts, pos, packet) RAW: for mysql-replication
 *   "packet" is the protocol payload (its first byte the 0x00 OK marker), as
 *   PyMySQL's MysqlPacket holds it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "binlake_native.h"

enum {
    EV_QUERY = 2, EV_ROTATE = 4, EV_FORMAT = 15, EV_XID = 16, EV_TABLE_MAP = 19,
    EV_WRITE1 = 23, EV_UPDATE1 = 24, EV_DELETE1 = 25, EV_HEARTBEAT = 27,
    EV_WRITE2 = 30, EV_UPDATE2 = 31, EV_DELETE2 = 32, EV_GTID = 33, EV_MARIADB_GTID = 162,
};
enum { K_EOF = -1, K_ERROR = -2, K_BADSUM = -3, K_RAW = -4 };

/* The binlog's CRC32 (zlib's polynomial), eight bytes per step ("slicing by 8"):
   table k holds the CRC of a byte followed by k zero bytes, so eight table look-ups
   fold eight input bytes at once. Byte by byte, the checksum was the source's largest
   single cost in bulk (a third of its CPU on 1,000-row transactions, bench/RESULTS.md);
   sliced it is about five times faster, and identical (tests/source/test_mysql_framing.py
   checks it against zlib.crc32). */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_of(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        /* Little-endian assembly by shifts: no alignment or byte-order assumption. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

typedef struct {
    PyObject_HEAD
    unsigned char *buf;   /* bytes received and not yet consumed: buf[off:len] */
    size_t len, cap, off;
    unsigned char *multi; /* a payload split over 16 MiB packets, being joined */
    size_t mlen, mcap;
    int in_multi;
    int checksum;
    unsigned char post[256];
    int npost;
} FramerObject;

static int append(PyObject *list, PyObject *item) {
    if (!item) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *raw(int type, uint64_t ts, uint64_t pos, const unsigned char *p, size_t n) {
    return Py_BuildValue("(iiKKy#)", K_RAW, type, (unsigned long long)ts, (unsigned long long)pos, (const char *)p,
                         (Py_ssize_t)n);
}

/* One protocol payload p[0:n] -> zero or one tuple appended to out. */
static int one_payload(FramerObject *self, const unsigned char *p, size_t n, PyObject *out) {
    if (n == 0) return 0;
    if (p[0] == 0xFE && n < 9) return append(out, Py_BuildValue("(i)", K_EOF));
    if (p[0] == 0xFF) return append(out, Py_BuildValue("(iy#)", K_ERROR, (const char *)p, (Py_ssize_t)n));
    if (p[0] != 0x00) return 0; /* neither OK nor error: mysql-replication skips it too */
    const unsigned char *e = p + 1;
    size_t en = n - 1;
    if (en < 19) return append(out, raw(-1, 0, 0, p, n));
    uint64_t ts = bl_le(e, 4), size = bl_le(e + 9, 4), pos = bl_le(e + 13, 4);
    int type = e[4];
    if (size != en) return append(out, raw(type, ts, pos, p, n));
    size_t known;
    switch (type) {
    case EV_QUERY: known = 13; break;
    case EV_ROTATE: case EV_TABLE_MAP: case EV_WRITE1: case EV_UPDATE1: case EV_DELETE1: known = 8; break;
    case EV_WRITE2: case EV_UPDATE2: case EV_DELETE2: known = 10; break;
    case EV_XID: case EV_HEARTBEAT: case EV_GTID: case EV_MARIADB_GTID: known = 0; break;
    case EV_FORMAT: return append(out, raw(type, ts, pos, p, n));
    default: return 0; /* not an event the source reads */
    }
    size_t tail = self->checksum ? 4 : 0;
    if (size < 19 + tail) return append(out, raw(type, ts, pos, p, n));
    const unsigned char *b = e + 19;
    size_t blen = size - 19 - tail;
    if (known && type - 1 < self->npost && self->post[type - 1] != known) return append(out, raw(type, ts, pos, p, n));
    if (blen < known) return append(out, raw(type, ts, pos, p, n));
    /* Every logged event carries its CRC32; the server's artificial ROTATE and
       heartbeats are not checked (they are not binlog content). */
    if (self->checksum && type != EV_ROTATE && type != EV_HEARTBEAT &&
        crc32_of(e, size - 4) != (uint32_t)bl_le(e + size - 4, 4))
        return append(out, Py_BuildValue("(iiK)", K_BADSUM, type, (unsigned long long)pos));
    switch (type) {
    case EV_XID: case EV_HEARTBEAT: case EV_GTID: case EV_MARIADB_GTID:
        return append(out, Py_BuildValue("(iKK)", type, (unsigned long long)ts, (unsigned long long)pos));
    case EV_ROTATE:
        return append(out, Py_BuildValue("(iKKKy#)", type, (unsigned long long)ts, (unsigned long long)pos,
                                         (unsigned long long)bl_le(b, 8), (const char *)b + 8, (Py_ssize_t)(blen - 8)));
    case EV_QUERY: {
        size_t sl = b[8], svl = bl_le(b + 11, 2);
        if (13 + svl + sl + 1 > blen) return append(out, raw(type, ts, pos, p, n));
        const unsigned char *s = b + 13 + svl, *q = s + sl + 1;
        return append(out, Py_BuildValue("(iKKy#y#)", type, (unsigned long long)ts, (unsigned long long)pos,
                                         (const char *)s, (Py_ssize_t)sl, (const char *)q,
                                         (Py_ssize_t)(b + blen - q)));
    }
    case EV_TABLE_MAP:
        return append(out, Py_BuildValue("(iKKKy#y#)", type, (unsigned long long)ts, (unsigned long long)pos,
                                         (unsigned long long)bl_le(b, 6), (const char *)b, (Py_ssize_t)blen,
                                         (const char *)p, (Py_ssize_t)n));
    default: break;
    }
    /* rows events */
    size_t at = known;
    if (known == 10) {
        size_t extra = bl_le(b + 8, 2);
        if (extra != 2) return append(out, raw(type, ts, pos, p, n)); /* extra row info: mysql-replication */
    }
    if (at >= blen) return append(out, raw(type, ts, pos, p, n));
    uint64_t ncols;
    unsigned c = b[at++];
    if (c < 251) ncols = c;
    else {
        int w = c == 252 ? 2 : c == 253 ? 3 : c == 254 ? 8 : 0;
        if (!w || at + w > blen) return append(out, raw(type, ts, pos, p, n));
        ncols = bl_le(b + at, w);
        at += w;
    }
    size_t bm = (size_t)((ncols + 7) / 8);
    int update = type == EV_UPDATE1 || type == EV_UPDATE2;
    if (ncols > 4096 || at + bm * (update ? 2 : 1) > blen) return append(out, raw(type, ts, pos, p, n));
    const unsigned char *bm1 = b + at;
    at += bm;
    const unsigned char *bm2 = NULL;
    if (update) { bm2 = b + at; at += bm; }
    Py_ssize_t base = (Py_ssize_t)(b - p);
    PyObject *bm2obj = bm2 ? PyBytes_FromStringAndSize((const char *)bm2, (Py_ssize_t)bm) : Py_NewRef(Py_None);
    if (!bm2obj) return -1;
    PyObject *t = Py_BuildValue("(iKKKy#nnKy#N)", type, (unsigned long long)ts, (unsigned long long)pos,
                                (unsigned long long)bl_le(b, 6), (const char *)p, (Py_ssize_t)n, base + (Py_ssize_t)at,
                                base + (Py_ssize_t)blen, (unsigned long long)ncols, (const char *)bm1,
                                (Py_ssize_t)bm, bm2obj);
    return append(out, t);
}

static PyObject *Framer_feed(FramerObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    PyObject *out = NULL;
    if (bl_grow(&self->buf, &self->cap, self->len + (size_t)data.len, 65536) < 0) goto done;
    memcpy(self->buf + self->len, data.buf, (size_t)data.len);
    self->len += (size_t)data.len;
    out = PyList_New(0);
    if (!out) goto done;
    while (self->len - self->off >= 4) {
        const unsigned char *h = self->buf + self->off;
        size_t plen = bl_le(h, 3);
        if (self->len - self->off < 4 + plen) break;
        const unsigned char *payload = h + 4;
        self->off += 4 + plen;
        if (plen == 0xFFFFFF || self->in_multi) {
            /* A payload of 16 MiB - 1 continues in the next packet (PyMySQL joins them the same way). */
            if (bl_grow(&self->multi, &self->mcap, self->mlen + plen, 65536) < 0) { Py_CLEAR(out); goto done; }
            memcpy(self->multi + self->mlen, payload, plen);
            self->mlen += plen;
            self->in_multi = plen == 0xFFFFFF;
            if (self->in_multi) continue;
            int rc = one_payload(self, self->multi, self->mlen, out);
            self->mlen = 0;
            if (rc < 0) { Py_CLEAR(out); goto done; }
            continue;
        }
        if (one_payload(self, payload, plen, out) < 0) { Py_CLEAR(out); goto done; }
    }
    /* Keep only the incomplete packet at the front (a large rows event spans many reads). */
    if (self->off) {
        memmove(self->buf, self->buf + self->off, self->len - self->off);
        self->len -= self->off;
        self->off = 0;
    }
done:
    PyBuffer_Release(&data);
    return out;
}

static PyObject *Framer_set_post_header(FramerObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    Py_ssize_t n = b.len < 256 ? b.len : 256;
    memcpy(self->post, b.buf, (size_t)n);
    self->npost = (int)n;
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *Framer_pending(FramerObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(self->len - self->off + self->mlen);
}

static int Framer_init(FramerObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"checksum", NULL};
    int checksum = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "p", kwlist, &checksum)) return -1;
    self->checksum = checksum;
    self->npost = 0;
    self->len = self->off = self->mlen = 0;
    self->in_multi = 0;
    return 0;
}

static void Framer_dealloc(FramerObject *self) {
    PyMem_Free(self->buf);
    PyMem_Free(self->multi);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Framer_methods[] = {
    {"feed", (PyCFunction)Framer_feed, METH_VARARGS, "feed($self, data, /)\n--\n\nReturns the list of event tuples (see the module docstring)."},
    {"set_post_header", (PyCFunction)Framer_set_post_header, METH_VARARGS,
     "set_post_header($self, lengths, /)\n--\n\nThe FORMAT_DESCRIPTION's post-header lengths, index event type - 1."},
    {"pending", (PyCFunction)Framer_pending, METH_NOARGS, "pending($self, /)\n--\n\nBytes received and not yet framed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FramerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "binlake.source.mysql._framec.Framer",
    .tp_basicsize = sizeof(FramerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Framer(checksum)\n--\n\nFrames a replication stream into event tuples (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Framer_init,
    .tp_dealloc = (destructor)Framer_dealloc,
    .tp_methods = Framer_methods,
};

static PyObject *mod_crc32(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    uint32_t c = crc32_of(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef module_methods[] = {
    {"crc32", mod_crc32, METH_VARARGS, "crc32(data, /)\n--\n\nReturns the binlog's CRC32 of data."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef framec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_framec",
    .m_doc = "Native framing of the MySQL/MariaDB replication stream.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__framec(void) {
    crc_init();
    if (PyType_Ready(&FramerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&framec_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Framer", (PyObject *)&FramerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
