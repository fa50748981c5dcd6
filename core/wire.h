/*
** wire.h: the framing and field encoding spoken between the host and the
** in-sandbox agent (agent/). Shared by both ends, header-only, every
** function static.
**
** A frame is
**     u32 length (of everything after this word, little-endian)
**     u32 id     (the request's id; a reply carries the id it answers)
**     fields...  (until the end of the frame)
** and a field is
**     u8  key length (1..WIRE_MAX_KEY), the key bytes,
**     u8  type, u32 value length, the value bytes.
** Types: WIRE_BYTES (any bytes), WIRE_INT (8 bytes, i64 LE), WIRE_BOOL
** (1 byte, 0 or 1), WIRE_STRS (a list: each item u32 length + bytes),
** WIRE_MAP (pairs: u32 length + key bytes, u32 length + value bytes),
** WIRE_INTS (a list of i64 LE, 8 bytes each).
**
** Requests carry `op`; each gets one reply with its id (agent/conn.c dispatches).
** This is the one table of the protocol (ARCHITECTURE.md shows it too):
**     op        request fields                     reply
**     hello     -                                  version, pid, uid
**     setup     env (map), workdir, lifetime_ms    ok
**               (lifetime_ms may only shorten the agent's lifetime)
**     exec      argv, cwd, env, stdin, timeout_ms, exit_code | signal, stdout, stderr,
**               max_output_bytes, kill_grace_ms,   stdout_truncated, stderr_truncated,
**               drain_ms, stream (bool)            timed_out, cancelled, duration_ms
**     cancel    target (an exec's id)              ok
**     signal    target, signal (1..64)             ok
**     read      path, max_bytes                    data | missing
**               with offset, length: a range       data, size, ino, mtime_ns, eof
**     write     path, data, mode                   ok
**               more (bool): an upload's first     ok, upload (its id)
**               upload, data, more: a later part   ok (the last, without more, renames)
**               upload, abort (bool)               ok (dropped, its temporary file too)
**     list      path                               names, types, sizes, modified | missing
**     remove    path, recursive                    removed
**     ping      -                                  ok
**     shutdown  -                                  ok, then every process ends
** A large file moves in parts so that neither end handles it in one frame:
** the host reads ranges until eof (each part must show the same size, ino
** and mtime_ns), and writes an upload: a temporary file beside the path
** that the last part renames over it, all or nothing (agent/fileops.c).
** An error reply carries `error` (a token) and `message` (the agent's words,
** never shown to users) instead. Tokens: `invalid` (a malformed request),
** `too_large`, `too_many_entries`, `is_directory`, `not_directory`,
** `not_regular`, and errno names (`ENOENT`, `EACCES`, `EPERM`, `EROFS`,
** `ENOSPC`, `EDQUOT`, `EFBIG`, `ENOTEMPTY`, `ENAMETOOLONG`, `ELOOP`, ...);
** the host maps each to its own error (_agent_backend.reply_error).
**
** Streaming: an exec with `stream = true` gets, before its reply, frames
** with its id and `more = true` (the only frames that are not a reply):
**     more, pid              first, once the command runs (pid in the sandbox)
**     more, fd (1|2), data   output of stdout (1) or stderr (2), in the order
**                            the agent read it, each as soon as it was read;
**                            at most max_output_bytes of each stream in all
**                            (what is past the cap is dropped and marks the
**                            stream truncated in the reply)
** Its reply then has empty stdout and stderr: the chunks were the output.
** `signal` sends a signal to a running exec's tree without cancelling it
** (the reply tells how it ended). A `more` frame for a request that did not
** ask to stream is a protocol error.
**
** The parser trusts nothing: what the other end sends may be hostile (code
** in the sandbox runs as the same user as the agent and may replace it), so
** every length is checked against what is left before it is used.
*/
#ifndef MAYURA_WIRE_H
#define MAYURA_WIRE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_BYTES 1
#define WIRE_INT   2
#define WIRE_BOOL  3
#define WIRE_STRS  4
#define WIRE_MAP   5
#define WIRE_INTS  6

#define WIRE_MAX_KEY    64
#define WIRE_MAX_FIELDS 64
#define WIRE_HEADER     8            /* length + id */
#define WIRE_MAX_FRAME  (1u << 30)   /* 1 GiB: a file of max_file_bytes plus fields */

#define WIRE_UNUSED __attribute__((unused))

typedef struct wire_field {
    const char *key;
    size_t key_len;
    int type;
    const unsigned char *val;
    size_t len;
} wire_field;

typedef struct wire_msg {
    uint32_t id;
    int nfields;
    wire_field fields[WIRE_MAX_FIELDS];
} wire_msg;

static WIRE_UNUSED uint32_t wire_get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static WIRE_UNUSED void wire_put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static WIRE_UNUSED int64_t wire_get_i64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = v << 8 | p[i];
    return (int64_t)v;
}

static WIRE_UNUSED void wire_put_i64(unsigned char *p, int64_t sv) {
    uint64_t v = (uint64_t)sv;
    int i;
    for (i = 0; i < 8; i++) { p[i] = (unsigned char)v; v >>= 8; }
}

/* Checks the items of a list or map value: each item is u32 length + bytes. */
static WIRE_UNUSED int wire_check_items(const unsigned char *v, size_t len, int per) {
    size_t off = 0;
    while (off < len) {
        int k;
        for (k = 0; k < per; k++) {
            uint32_t n;
            if (len - off < 4) return -1;
            n = wire_get_u32(v + off);
            off += 4;
            if (n > len - off) return -1;
            off += n;
        }
    }
    return 0;
}

/*
** Parses the body of one frame (everything after the length word: id and
** fields, body_len bytes). Returns 0, or -1 when the body is malformed.
** Field views point into body, which must outlive msg.
*/
static WIRE_UNUSED int wire_parse(const unsigned char *body, size_t body_len, wire_msg *msg) {
    size_t off = 4;
    if (body_len < 4) return -1;
    msg->id = wire_get_u32(body);
    msg->nfields = 0;
    while (off < body_len) {
        wire_field *f;
        size_t klen;
        uint32_t vlen;
        if (msg->nfields >= WIRE_MAX_FIELDS) return -1;
        klen = body[off++];
        if (klen == 0 || klen > WIRE_MAX_KEY || body_len - off < klen + 5) return -1;
        f = &msg->fields[msg->nfields];
        f->key = (const char *)body + off;
        f->key_len = klen;
        off += klen;
        f->type = body[off++];
        vlen = wire_get_u32(body + off);
        off += 4;
        if (vlen > body_len - off) return -1;
        f->val = body + off;
        f->len = vlen;
        off += vlen;
        switch (f->type) {
        case WIRE_BYTES: break;
        case WIRE_INT: if (vlen != 8) return -1; break;
        case WIRE_BOOL: if (vlen != 1 || f->val[0] > 1) return -1; break;
        case WIRE_STRS: if (wire_check_items(f->val, vlen, 1) != 0) return -1; break;
        case WIRE_MAP: if (wire_check_items(f->val, vlen, 2) != 0) return -1; break;
        case WIRE_INTS: if (vlen % 8 != 0) return -1; break;
        default: return -1;
        }
        msg->nfields++;
    }
    return 0;
}

/* The field named key, or NULL. */
static WIRE_UNUSED const wire_field *wire_find(const wire_msg *msg, const char *key) {
    size_t kl = strlen(key);
    int i;
    for (i = 0; i < msg->nfields; i++)
        if (msg->fields[i].key_len == kl && memcmp(msg->fields[i].key, key, kl) == 0)
            return &msg->fields[i];
    return NULL;
}

/* Walks the items of a WIRE_STRS or WIRE_MAP value: *off starts at 0; returns 0 at the end. */
static WIRE_UNUSED int wire_next_item(const wire_field *f, size_t *off, const unsigned char **item, size_t *len) {
    uint32_t n;
    if (*off >= f->len || f->len - *off < 4) return 0;
    n = wire_get_u32(f->val + *off);
    *off += 4;
    if (n > f->len - *off) return 0;
    *item = f->val + *off;
    *len = n;
    *off += n;
    return 1;
}

/* {======================================================
** Building frames
** =======================================================*/

typedef struct wire_buf {
    unsigned char *data;
    size_t len, size;
    int failed;          /* an allocation failed or the frame grew past WIRE_MAX_FRAME */
} wire_buf;

static WIRE_UNUSED int wire_reserve(wire_buf *b, size_t more) {
    size_t want;
    unsigned char *nd;
    if (b->failed) return -1;
    if (more > WIRE_MAX_FRAME || b->len + more > (size_t)WIRE_MAX_FRAME + WIRE_HEADER) { b->failed = 1; return -1; }
    if (b->len + more <= b->size) return 0;
    want = b->size ? b->size : 256;
    while (want < b->len + more) want *= 2;
    nd = (unsigned char *)realloc(b->data, want);
    if (nd == NULL) { b->failed = 1; return -1; }
    b->data = nd;
    b->size = want;
    return 0;
}

static WIRE_UNUSED void wire_raw(wire_buf *b, const void *p, size_t n) {
    if (wire_reserve(b, n) != 0) return;
    if (n > 0) memcpy(b->data + b->len, p, n);
    b->len += n;
}

static WIRE_UNUSED void wire_u32(wire_buf *b, uint32_t v) {
    unsigned char w[4];
    wire_put_u32(w, v);
    wire_raw(b, w, 4);
}

/* Starts a frame with its id; the length is filled in by wire_end. */
static WIRE_UNUSED void wire_begin(wire_buf *b, uint32_t id) {
    b->len = 0;
    b->failed = 0;
    wire_u32(b, 0);
    wire_u32(b, id);
}

/* Writes the frame's length word; returns 0, or -1 when building failed. */
static WIRE_UNUSED int wire_end(wire_buf *b) {
    if (b->failed || b->len < WIRE_HEADER) return -1;
    wire_put_u32(b->data, (uint32_t)(b->len - 4));
    return 0;
}

static WIRE_UNUSED void wire_key(wire_buf *b, const char *key, int type, size_t vlen) {
    size_t kl = strlen(key);
    unsigned char c;
    if (kl == 0 || kl > WIRE_MAX_KEY || vlen > WIRE_MAX_FRAME) { b->failed = 1; return; }
    c = (unsigned char)kl;
    wire_raw(b, &c, 1);
    wire_raw(b, key, kl);
    c = (unsigned char)type;
    wire_raw(b, &c, 1);
    wire_u32(b, (uint32_t)vlen);
}

static WIRE_UNUSED void wire_add_bytes(wire_buf *b, const char *key, const void *p, size_t n) {
    wire_key(b, key, WIRE_BYTES, n);
    wire_raw(b, p, n);
}

static WIRE_UNUSED void wire_add_str(wire_buf *b, const char *key, const char *s) {
    wire_add_bytes(b, key, s, strlen(s));
}

static WIRE_UNUSED void wire_add_int(wire_buf *b, const char *key, int64_t v) {
    unsigned char w[8];
    wire_put_i64(w, v);
    wire_key(b, key, WIRE_INT, 8);
    wire_raw(b, w, 8);
}

static WIRE_UNUSED void wire_add_bool(wire_buf *b, const char *key, int v) {
    unsigned char c = v ? 1 : 0;
    wire_key(b, key, WIRE_BOOL, 1);
    wire_raw(b, &c, 1);
}

/*
** Lists and maps are written in two steps: wire_open_list reserves the
** field header and returns its offset; items follow with wire_item; then
** wire_close_list fills the value length in.
*/
static WIRE_UNUSED size_t wire_open_list(wire_buf *b, const char *key, int type) {
    size_t at;
    wire_key(b, key, type, 0);
    at = b->len;
    return at;
}

static WIRE_UNUSED void wire_item(wire_buf *b, const void *p, size_t n) {
    if (n > WIRE_MAX_FRAME) { b->failed = 1; return; }
    wire_u32(b, (uint32_t)n);
    wire_raw(b, p, n);
}

static WIRE_UNUSED void wire_int_item(wire_buf *b, int64_t v) {
    unsigned char w[8];
    wire_put_i64(w, v);
    wire_raw(b, w, 8);
}

static WIRE_UNUSED void wire_close_list(wire_buf *b, size_t at) {
    if (b->failed || at < 4 || at > b->len) return;
    wire_put_u32(b->data + at - 4, (uint32_t)(b->len - at));
}

/* }====================================================== */

#endif
