/*
** stream.c: core.stream_parser(kind, opts), incremental parsers for the
** streamed answers of hosted services. Bytes go in as they arrive, in
** pieces of any size; whole messages come out.
**
**   local p = core.stream_parser('sse', { max_bytes = 1048576 })
**   local events, err = p:feed(chunk)    -- events: an array, err: nil or a coded error
**   local events, err = p:finish()       -- at the end of the body
**
** Kinds and their events:
**
**   'connect'  Connect protocol streaming envelopes: 1 flag byte, a 4-byte
**              big-endian length, that many bytes of message. Each gives
**              { data = message }; the end-of-stream envelope (flag 0x02)
**              gives { data = trailer, end_stream = true } and must be the
**              last bytes. A compressed envelope (0x01: we never ask for
**              compression) or unknown flag bits are refused; finish()
**              refuses a stream cut inside an envelope or without its
**              end-of-stream envelope.
**   'ndjson'   one message per line: { data = line } for every line that is
**              not blank, without its LF or CRLF. finish() gives a last line
**              that has no line end.
**   'sse'      server-sent events as the WHATWG event-stream rules read
**              them: lines end with CRLF, LF or CR (a CR at the end of one
**              piece and an LF at the start of the next are one line end);
**              a leading UTF-8 BOM is dropped; ':' starts a comment;
**              fields data (joined with LF), event, id (ignored when it
**              holds NUL; kept across events) and retry (digits only;
**              p:retry_ms() reads it); a blank line dispatches
**              { event = type or 'message', data = data, id = last id }
**              unless no data came. finish() drops an event without its
**              blank line, as the rules say. Bytes are passed through as
**              they are (no UTF-8 replacement).
**   'eventstream'  AWS event-stream messages (application/vnd.amazon.eventstream):
**              a 12-byte prelude (total length, headers length, both 4-byte
**              big-endian, and the CRC-32 of those 8 bytes), the headers,
**              the payload, and the CRC-32 of all that precedes it. Each
**              gives { data = payload, headers = { name = value },
**              message_type = headers[':message-type'], event = the
**              ':event-type', ':exception-type' or ':error-code' header
**              (the first there, when its value is a string or bytes) }.
**              Header values by type: 0/1 true/false, 2 byte, 3 int16,
**              4 int32, 5 int64 and 8 timestamp (ms) as integers, 6 bytes
**              and 7 string as strings, 9 uuid as its 16 bytes. A wrong
**              CRC, a header that does not fit its block, an unknown type, a
**              name given twice or a total below 16 bytes is refused;
**              finish() refuses a stream cut inside a message.
**
** `max_bytes` (16 MiB by default) caps a single message, line or event's
** data (an SSE line may be 16 bytes longer, for its field name, so that a
** value of max_bytes fits): a longer one fails with LIMIT_EXCEEDED as soon as it is known to be
** longer, so what the parser holds never grows past about max_bytes plus
** the piece being fed. Malformed input fails with INVALID_INPUT. After a
** failure the parser stays failed: every later call gives the same error
** and no events. Events decoded before the failure are still returned with
** it, so a stream gives the same events and error however it is cut.
*/
#include "mc.h"
#include "crc.h"

#define MC_SP_MT "mayura.stream_parser"
#define MC_SP_DEFAULT_MAX ((lua_Integer)16 * 1024 * 1024)
#define MC_SP_MAX_MAX ((lua_Integer)1024 * 1024 * 1024)
/* An SSE line may pass max_bytes by this much: room for its field name ("data: "). */
#define MC_SP_FIELD_ROOM ((size_t)16)
/* A buffer whose capacity grew past this is given back once it is nearly empty. */
#define MC_SP_KEEP ((size_t)64 * 1024)

enum { MC_SP_CONNECT, MC_SP_NDJSON, MC_SP_SSE, MC_SP_EVENTSTREAM };
/* AWS caps an event-stream message's headers at 128 KiB. */
#define MC_SP_ES_MAX_HEADERS ((size_t)128 * 1024)

typedef mc_buf mc_sp_buf;

typedef struct mc_sp {
    int kind;
    size_t max;
    mc_sp_buf in;      /* bytes not consumed yet: in.p[pos .. in.len) */
    size_t pos;
    size_t scan;       /* bytes after pos known to hold no line end */
    int finished;
    int ended;         /* connect: the end-of-stream envelope was read */
    const char *err_code; /* NULL while healthy */
    char err_msg[160];
    /* sse */
    int bom_done;
    int skip_lf;       /* the last line ended with CR: an LF next belongs to it */
    mc_sp_buf data, event, id;
    int has_id;
    lua_Integer retry; /* -1: none given */
} mc_sp;

static const mc_class mc_sp_class;   /* at the end of the file */

/* {======================================================
** Buffers
** =======================================================*/

/* Appends n bytes; returns -1 when memory runs out. */
static int mc_sp_add(mc_sp_buf *b, const char *p, size_t n) {
    return mc_buf_add(b, p, n, SIZE_MAX, 256);
}

static int mc_sp_set(mc_sp_buf *b, const char *p, size_t n) {
    b->len = 0;
    return mc_sp_add(b, p, n);
}


/* Gives memory back from a buffer that grew large and is nearly empty now. */
static void mc_sp_trim(mc_sp_buf *b) {
    if (b->cap > MC_SP_KEEP && b->len < b->cap / 4) {
        size_t cap = b->len > 256 ? b->len : 256;
        char *np = (char *)realloc(b->p, cap);
        if (np != NULL) {
            b->p = np;
            b->cap = cap;
        }
    }
}

/* }====================================================== */

/* {======================================================
** Parsing (pure C: a failure is recorded, never raised)
** =======================================================*/

static void mc_sp_fail(mc_sp *s, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mc_sp_fail(mc_sp *s, const char *code, const char *fmt, ...) {
    va_list ap;
    if (s->err_code != NULL) return;
    s->err_code = code;
    va_start(ap, fmt);
    vsnprintf(s->err_msg, sizeof s->err_msg, fmt, ap);
    va_end(ap);
}

static void mc_sp_oom(mc_sp *s) {
    mc_sp_fail(s, MC_OOM_CODE, MC_OOM_MSG);
}

/* The events table is at index t; pushes one event table onto it. */
static void mc_sp_push_event(lua_State *L, int t, const char *data, size_t n, int end_stream) {
    lua_createtable(L, 0, 2);
    lua_pushlstring(L, data, n);
    lua_setfield(L, -2, "data");
    if (end_stream) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "end_stream");
    }
    lua_rawseti(L, t, (lua_Integer)lua_rawlen(L, t) + 1);
}

static void mc_sp_connect(lua_State *L, mc_sp *s, int t) {
    while (s->err_code == NULL && s->in.len - s->pos >= 5) {
        const unsigned char *h = (const unsigned char *)s->in.p + s->pos;
        unsigned flags = h[0];
        size_t n = ((size_t)h[1] << 24) | ((size_t)h[2] << 16) | ((size_t)h[3] << 8) | (size_t)h[4];
        if (s->ended) {
            mc_sp_fail(s, "INVALID_INPUT", "bytes after the end of the stream");
            return;
        }
        if (flags & 0x01) {
            mc_sp_fail(s, "INVALID_INPUT", "a compressed message, which was never asked for");
            return;
        }
        if (flags & ~0x03u) {
            mc_sp_fail(s, "INVALID_INPUT", "an envelope with unknown flags 0x%02x", flags);
            return;
        }
        if (n > s->max) {
            mc_sp_fail(s, "LIMIT_EXCEEDED", "a message of %zu bytes, above the limit of %zu", n, s->max);
            return;
        }
        if (s->in.len - s->pos - 5 < n) return;
        mc_sp_push_event(L, t, s->in.p + s->pos + 5, n, (flags & 0x02) != 0);
        s->pos += 5 + n;
        if (flags & 0x02) s->ended = 1;
    }
    if (s->ended && s->pos < s->in.len) mc_sp_fail(s, "INVALID_INPUT", "bytes after the end of the stream");
}

static uint32_t mc_sp_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static lua_Integer mc_sp_be_signed(const unsigned char *p, int n) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < n; i++) v = (v << 8) | p[i];
    if (n < 8 && (p[0] & 0x80)) v |= ~(uint64_t)0 << (8 * n);   /* sign-extend */
    return (lua_Integer)(int64_t)v;
}

/* Reads one message's headers h[0..n) into a table on the stack; returns 0, or -1 after mc_sp_fail. */
static int mc_sp_es_headers(lua_State *L, mc_sp *s, const unsigned char *h, size_t n) {
    size_t at = 0;
    int t;
    lua_createtable(L, 0, 4);
    t = lua_gettop(L);
    while (at < n) {
        size_t name_len = h[at], vlen;
        const char *name;
        unsigned type;
        static const unsigned char fixed[10] = { 0, 0, 1, 2, 4, 8, 0, 0, 8, 16 };
        if (name_len == 0 || n - at - 1 < name_len + 1) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream header does not fit its block");
            return -1;
        }
        name = (const char *)h + at + 1;
        type = h[at + 1 + name_len];
        at += 2 + name_len;
        if (type > 9) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream header of unknown type %u", type);
            return -1;
        }
        if (type == 6 || type == 7) {
            if (n - at < 2) {
                mc_sp_fail(s, "INVALID_INPUT", "an event-stream header does not fit its block");
                return -1;
            }
            vlen = ((size_t)h[at] << 8) | h[at + 1];
            at += 2;
        } else {
            vlen = fixed[type];
        }
        if (n - at < vlen) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream header does not fit its block");
            return -1;
        }
        lua_pushlstring(L, name, name_len);
        lua_rawget(L, t);
        if (!lua_isnil(L, -1)) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream header given twice");
            return -1;
        }
        lua_pop(L, 1);
        lua_pushlstring(L, name, name_len);
        switch (type) {
        case 0: lua_pushboolean(L, 1); break;
        case 1: lua_pushboolean(L, 0); break;
        case 2: case 3: case 4: case 5: case 8: lua_pushinteger(L, mc_sp_be_signed(h + at, (int)vlen)); break;
        default: lua_pushlstring(L, (const char *)h + at, vlen); break;
        }
        lua_rawset(L, t);
        at += vlen;
    }
    return 0;
}

static void mc_sp_eventstream(lua_State *L, mc_sp *s, int t) {
    while (s->err_code == NULL && s->in.len - s->pos >= 12) {
        const unsigned char *m = (const unsigned char *)s->in.p + s->pos;
        size_t total = mc_sp_be32(m), hlen = mc_sp_be32(m + 4), plen;
        int ev, kind;
        if (mc_crc32(0, m, 8) != mc_sp_be32(m + 8)) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream prelude with a wrong CRC");
            return;
        }
        if (total < 16 || hlen > total - 16) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream message whose lengths do not add up");
            return;
        }
        if (hlen > MC_SP_ES_MAX_HEADERS) {
            mc_sp_fail(s, "LIMIT_EXCEEDED", "event-stream headers of %zu bytes, above 128 KiB", hlen);
            return;
        }
        plen = total - 16 - hlen;
        if (plen > s->max) {
            mc_sp_fail(s, "LIMIT_EXCEEDED", "a message of %zu bytes, above the limit of %zu", plen, s->max);
            return;
        }
        if (s->in.len - s->pos < total) return;
        if (mc_crc32(0, m, total - 4) != mc_sp_be32(m + total - 4)) {
            mc_sp_fail(s, "INVALID_INPUT", "an event-stream message with a wrong CRC");
            return;
        }
        lua_createtable(L, 0, 4);
        ev = lua_gettop(L);
        lua_pushlstring(L, (const char *)m + 12 + hlen, plen);
        lua_setfield(L, ev, "data");
        if (mc_sp_es_headers(L, s, m + 12, hlen) != 0) {
            lua_settop(L, ev - 1);
            return;
        }
        lua_getfield(L, -1, ":message-type");
        if (lua_type(L, -1) == LUA_TSTRING) lua_setfield(L, ev, "message_type");
        else lua_pop(L, 1);
        for (kind = 0; kind < 3; kind++) {
            static const char *const names[] = { ":event-type", ":exception-type", ":error-code" };
            lua_getfield(L, -1, names[kind]);
            if (lua_type(L, -1) == LUA_TSTRING) {
                lua_setfield(L, ev, "event");
                break;
            }
            lua_pop(L, 1);
        }
        lua_setfield(L, ev, "headers");
        lua_rawseti(L, t, (lua_Integer)lua_rawlen(L, t) + 1);
        s->pos += total;
    }
}

static int mc_sp_blank(const char *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

static void mc_sp_ndjson_line(lua_State *L, mc_sp *s, int t, const char *p, size_t n) {
    if (n > 0 && p[n - 1] == '\r') n--;
    if (n > s->max) {
        mc_sp_fail(s, "LIMIT_EXCEEDED", "a line of %zu bytes, above the limit of %zu", n, s->max);
        return;
    }
    if (!mc_sp_blank(p, n)) mc_sp_push_event(L, t, p, n, 0);
}

static void mc_sp_ndjson(lua_State *L, mc_sp *s, int t) {
    while (s->err_code == NULL && s->pos < s->in.len) {
        const char *start = s->in.p + s->pos;
        size_t avail = s->in.len - s->pos;
        const char *nl = (const char *)memchr(start + s->scan, '\n', avail - s->scan);
        if (nl == NULL) {
            s->scan = avail;
            /* one byte more than max may still be a CR before the LF */
            if (avail > s->max + 1 || (avail == s->max + 1 && start[avail - 1] != '\r'))
                mc_sp_fail(s, "LIMIT_EXCEEDED", "a line longer than the limit of %zu bytes", s->max);
            return;
        }
        mc_sp_ndjson_line(L, s, t, start, (size_t)(nl - start));
        s->pos += (size_t)(nl - start) + 1;
        s->scan = 0;
    }
}

static int mc_sp_is(const char *p, size_t n, const char *word) {
    return n == strlen(word) && memcmp(p, word, n) == 0;
}

static void mc_sp_sse_dispatch(lua_State *L, mc_sp *s, int t) {
    if (s->data.len == 0) {
        s->event.len = 0;
        return;
    }
    lua_createtable(L, 0, 3);
    /* the data buffer ends with the LF of its last line: not part of the data */
    lua_pushlstring(L, s->data.p, s->data.len - 1);
    lua_setfield(L, -2, "data");
    if (s->event.len > 0) lua_pushlstring(L, s->event.p, s->event.len);
    else lua_pushliteral(L, "message");
    lua_setfield(L, -2, "event");
    lua_pushlstring(L, s->id.len > 0 ? s->id.p : "", s->id.len);
    lua_setfield(L, -2, "id");
    lua_rawseti(L, t, (lua_Integer)lua_rawlen(L, t) + 1);
    s->data.len = 0;
    s->event.len = 0;
    mc_sp_trim(&s->data);
}

static void mc_sp_sse_line(lua_State *L, mc_sp *s, int t, const char *p, size_t n) {
    const char *colon, *v;
    size_t fn, vn;
    if (n > s->max + MC_SP_FIELD_ROOM) {
        mc_sp_fail(s, "LIMIT_EXCEEDED", "a line of %zu bytes, above the limit of %zu", n, s->max + MC_SP_FIELD_ROOM);
        return;
    }
    if (n == 0) {
        mc_sp_sse_dispatch(L, s, t);
        return;
    }
    if (p[0] == ':') return; /* a comment */
    colon = (const char *)memchr(p, ':', n);
    if (colon != NULL) {
        fn = (size_t)(colon - p);
        v = colon + 1;
        vn = n - fn - 1;
        if (vn > 0 && v[0] == ' ') { v++; vn--; }
    } else {
        fn = n;
        v = p + n;
        vn = 0;
    }
    if (mc_sp_is(p, fn, "data")) {
        if (s->data.len + vn > s->max) {
            mc_sp_fail(s, "LIMIT_EXCEEDED", "an event's data is longer than the limit of %zu bytes", s->max);
            return;
        }
        if (mc_sp_add(&s->data, v, vn) != 0 || mc_sp_add(&s->data, "\n", 1) != 0) mc_sp_oom(s);
    } else if (mc_sp_is(p, fn, "event")) {
        if (mc_sp_set(&s->event, v, vn) != 0) mc_sp_oom(s);
    } else if (mc_sp_is(p, fn, "id")) {
        if (memchr(v, '\0', vn) == NULL) {
            if (mc_sp_set(&s->id, v, vn) != 0) mc_sp_oom(s);
            s->has_id = 1;
        }
    } else if (mc_sp_is(p, fn, "retry")) {
        size_t i;
        lua_Integer r = 0;
        if (vn == 0) return;
        for (i = 0; i < vn; i++) {
            if (v[i] < '0' || v[i] > '9') return;
            if (r > (MC_MAX_SAFE_INT - 9) / 10) return; /* absurd: ignored */
            r = r * 10 + (v[i] - '0');
        }
        s->retry = r;
    }
    /* any other field is ignored */
}

static void mc_sp_sse(lua_State *L, mc_sp *s, int t) {
    static const char bom[3] = { '\xEF', '\xBB', '\xBF' };
    if (!s->bom_done) {
        size_t avail = s->in.len - s->pos, k = avail < 3 ? avail : 3;
        if (avail == 0) return;
        if (memcmp(s->in.p + s->pos, bom, k) == 0) {
            if (avail < 3) return; /* may still be a BOM */
            s->pos += 3;
        }
        s->bom_done = 1;
    }
    while (s->err_code == NULL && s->pos < s->in.len) {
        const char *start = s->in.p + s->pos, *q, *end;
        size_t avail = s->in.len - s->pos;
        if (s->skip_lf) {
            s->skip_lf = 0;
            if (start[0] == '\n') {
                s->pos++;
                continue;
            }
        }
        end = start + avail;
        for (q = start + s->scan; q < end && *q != '\n' && *q != '\r'; q++) {}
        if (q == end) {
            s->scan = avail;
            if (avail > s->max + MC_SP_FIELD_ROOM)
                mc_sp_fail(s, "LIMIT_EXCEEDED", "a line longer than the limit of %zu bytes", s->max + MC_SP_FIELD_ROOM);
            return;
        }
        mc_sp_sse_line(L, s, t, start, (size_t)(q - start));
        if (*q == '\r') s->skip_lf = 1;
        s->pos += (size_t)(q - start) + 1;
        s->scan = 0;
    }
}

/* Moves the unconsumed bytes to the front of the input buffer. */
static void mc_sp_compact(mc_sp *s) {
    if (s->pos == 0) return;
    if (s->pos < s->in.len) memmove(s->in.p, s->in.p + s->pos, s->in.len - s->pos);
    s->in.len -= s->pos;
    s->pos = 0;
    mc_sp_trim(&s->in);
}

static void mc_sp_run(lua_State *L, mc_sp *s, int t) {
    switch (s->kind) {
    case MC_SP_CONNECT: mc_sp_connect(L, s, t); break;
    case MC_SP_NDJSON: mc_sp_ndjson(L, s, t); break;
    case MC_SP_EVENTSTREAM: mc_sp_eventstream(L, s, t); break;
    default: mc_sp_sse(L, s, t); break;
    }
}

/* }====================================================== */

/* {======================================================
** The Lua object
** =======================================================*/

static mc_sp *mc_sp_check(lua_State *L) {
    return (mc_sp *)luaL_checkudata(L, 1, MC_SP_MT);
}

/* Returns the events table (at t) and the parser's error, if any. */
static int mc_sp_results(lua_State *L, mc_sp *s, int t) {
    lua_pushvalue(L, t);
    if (s->err_code == NULL) return 1;
    mc_push_error(L, s->err_code, "%s", s->err_msg);
    /* once failed, the parser holds nothing more */
    mc_buf_free(&s->in);
    mc_buf_free(&s->data);
    mc_buf_free(&s->event);
    mc_buf_free(&s->id);
    s->pos = s->scan = 0;
    return 2;
}

/* parser:feed(bytes) -> events[, err] */
static int l_sp_feed(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    size_t n;
    const char *p;
    int t;
    if (lua_type(L, 2) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "feed expects a string");
    p = lua_tolstring(L, 2, &n);
    if (s->finished) mc_raise(L, "INVALID_INPUT", "the parser was finished");
    lua_settop(L, 2);
    lua_newtable(L);
    t = lua_gettop(L);
    if (s->err_code != NULL) return mc_sp_results(L, s, t);
    if (s->kind == MC_SP_CONNECT && s->ended && n > 0) {
        mc_sp_fail(s, "INVALID_INPUT", "bytes after the end of the stream");
        return mc_sp_results(L, s, t);
    }
    mc_sp_compact(s);
    if (mc_sp_add(&s->in, p, n) != 0) mc_sp_oom(s);
    else mc_sp_run(L, s, t);
    if (s->pos == s->in.len) {
        s->in.len = s->pos = 0;
        mc_sp_trim(&s->in);
    }
    return mc_sp_results(L, s, t);
}

/* parser:finish() -> events[, err]: the end of the body. */
static int l_sp_finish(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    int t;
    lua_settop(L, 1);
    lua_newtable(L);
    t = lua_gettop(L);
    if (s->finished && s->err_code == NULL) return 1;
    s->finished = 1;
    if (s->err_code == NULL) {
        size_t left = s->in.len - s->pos;
        if (s->kind == MC_SP_CONNECT) {
            if (left > 0) mc_sp_fail(s, "INVALID_INPUT", "the stream ended inside a message");
            else if (!s->ended) mc_sp_fail(s, "INVALID_INPUT", "the stream ended without its end-of-stream message");
        } else if (s->kind == MC_SP_NDJSON) {
            if (left > 0) mc_sp_ndjson_line(L, s, t, s->in.p + s->pos, left);
        } else if (s->kind == MC_SP_EVENTSTREAM) {
            if (left > 0) mc_sp_fail(s, "INVALID_INPUT", "the stream ended inside a message");
        }
        /* sse: an event without its blank line is dropped */
        s->in.len = s->pos = 0;
    }
    return mc_sp_results(L, s, t);
}

/* parser:retry_ms() -> the last retry field of an SSE stream, or nil. */
static int l_sp_retry(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    if (s->retry < 0) lua_pushnil(L);
    else lua_pushinteger(L, s->retry);
    return 1;
}

/* parser:last_event_id() -> the last id field of an SSE stream, or nil. */
static int l_sp_last_id(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    if (!s->has_id) lua_pushnil(L);
    else lua_pushlstring(L, s->id.len ? s->id.p : "", s->id.len);
    return 1;
}

/* parser:pending() -> how many bytes the parser holds. */
static int l_sp_pending(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    lua_pushinteger(L, (lua_Integer)(s->in.len - s->pos + s->data.len));
    return 1;
}

static int l_sp_gc(lua_State *L) {
    mc_sp *s = (mc_sp *)lua_touserdata(L, 1);
    if (s == NULL) return 0;
    mc_buf_free(&s->in);
    mc_buf_free(&s->data);
    mc_buf_free(&s->event);
    mc_buf_free(&s->id);
    return 0;
}

static int l_sp_tostring(lua_State *L) {
    mc_sp *s = mc_sp_check(L);
    static const char *const names[] = { "connect", "ndjson", "sse", "eventstream" };
    lua_pushfstring(L, MC_SP_MT " (%s)", names[s->kind]);
    return 1;
}

static const char *const mc_sp_keys[] = { "max_bytes", NULL };

/* core.stream_parser(kind[, { max_bytes = n }]) -> parser */
static int l_stream_parser(lua_State *L) {
    static const char *const kinds[] = { "connect", "ndjson", "sse", "eventstream", NULL };
    const char *kind;
    int k;
    lua_Integer max = MC_SP_DEFAULT_MAX;
    mc_sp *s;
    if (lua_type(L, 1) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "kind must be 'connect', 'ndjson', 'sse' or 'eventstream'");
    kind = lua_tostring(L, 1);
    for (k = 0; kinds[k] != NULL; k++)
        if (strcmp(kinds[k], kind) == 0) break;
    if (kinds[k] == NULL) mc_raise(L, "INVALID_INPUT", "kind must be 'connect', 'ndjson', 'sse' or 'eventstream'");
    if (!lua_isnoneornil(L, 2)) {
        if (!lua_istable(L, 2)) mc_raise(L, "INVALID_INPUT", "options must be a table");
        mc_check_keys(L, 2, mc_sp_keys);
        max = mc_opt_int(L, 2, "max_bytes", MC_SP_DEFAULT_MAX, 1, MC_SP_MAX_MAX);
    }
    s = (mc_sp *)mc_handle_new(L, &mc_sp_class);
    s->kind = k;
    s->max = (size_t)max;
    s->retry = -1;
    return 1;
}

/* }====================================================== */

static const luaL_Reg mc_sp_methods[] = {
    {"feed", l_sp_feed},
    {"finish", l_sp_finish},
    {"retry_ms", l_sp_retry},
    {"last_event_id", l_sp_last_id},
    {"pending", l_sp_pending},
    {NULL, NULL}
};

static const mc_class mc_sp_class = { MC_SP_MT, sizeof(mc_sp), l_sp_gc, l_sp_tostring, mc_sp_methods, NULL };

static void mc_open_stream(lua_State *L) {
    mc_class_register(L, &mc_sp_class);
    lua_pushcfunction(L, l_stream_parser);
    lua_setfield(L, -2, "stream_parser");
}
