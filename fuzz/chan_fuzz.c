/*
** chan_fuzz: the channel of core/chan.c, what it believes of an agent and
** what it sends one. The first byte picks one of three modes:
**
** 0  a reply body: wire_parse, then chan_decode (protected, as the channel
**    runs it) into a table, checked field by field against the parse
**    (the last field of a key wins, as in the table).
**
** 1  a stream from a hostile agent, fed through the channel's own
**    chan_alloc / chan_on_read in chunks the input chooses, to a channel
**    made by chan_new with a small max_frame_bytes and K calls pending
**    (ids 1..K), then end of file. A model walks the same stream: each
**    complete good frame answers its call (its table checked as in 0);
**    the first frame over the limit, malformed, or for no pending call
**    closes the channel ('failed'), end of file otherwise ('gone'); then
**    every call still pending fails in id order, and on_close is called
**    once. The callbacks must see exactly that.
**
** 2  a request: a table shaped by the input goes through ch:call on a real
**    channel (core.channel on one end of a socketpair). Either call raises
**    INVALID_INPUT, or the bytes on the other end are one frame that
**    wire_parse takes, with the call's id and one field per key encoded as
**    documented (string, integer, boolean, list of strings or integers,
**    map of strings); that frame sent back as the reply reaches the
**    callback through libuv and decodes to the same fields (but for a
**    request with `more = true`, whose echo is a streaming frame for a call
**    that did not ask to stream: the channel fails the call with that).
*/
#include "fuzz_lua.h"

#include <sys/socket.h>

/* {------------------------------------------------------ the reply oracle */

static int same_bytes(lua_State *L, int idx, const unsigned char *p, size_t n) {
    size_t l;
    const char *s;
    if (lua_type(L, idx) != LUA_TSTRING) return 0;
    s = lua_tolstring(L, idx, &l);
    return l == n && memcmp(s, p, n) == 0;
}

static lua_Integer count_keys(lua_State *L, int t) {
    lua_Integer n = 0;
    t = lua_absindex(L, t);
    lua_pushnil(L);
    while (lua_next(L, t) != 0) {
        n++;
        lua_pop(L, 1);
    }
    return n;
}

/* Checks the decoded value at v against field f. */
static void check_value(lua_State *L, int v, const wire_field *f) {
    size_t off = 0, len;
    const unsigned char *item;
    lua_Integer k = 0;
    v = lua_absindex(L, v);
    switch (f->type) {
    case WIRE_BYTES:
        if (!same_bytes(L, v, f->val, f->len)) fz_fail("a BYTES field decoded wrong");
        break;
    case WIRE_INT:
        if (!lua_isinteger(L, v) || lua_tointeger(L, v) != (lua_Integer)wire_get_i64(f->val))
            fz_fail("an INT field decoded wrong");
        break;
    case WIRE_BOOL:
        if (lua_type(L, v) != LUA_TBOOLEAN || lua_toboolean(L, v) != (f->val[0] != 0))
            fz_fail("a BOOL field decoded wrong");
        break;
    case WIRE_STRS:
        if (lua_type(L, v) != LUA_TTABLE) fz_fail("a STRS field is not a table");
        while (wire_next_item(f, &off, &item, &len)) {
            lua_rawgeti(L, v, ++k);
            if (!same_bytes(L, -1, item, len)) fz_fail("a STRS item decoded wrong");
            lua_pop(L, 1);
        }
        if (count_keys(L, v) != k) fz_fail("a STRS table has extra entries");
        break;
    case WIRE_INTS:
        if (lua_type(L, v) != LUA_TTABLE) fz_fail("an INTS field is not a table");
        for (off = 0; off + 8 <= f->len; off += 8) {
            lua_rawgeti(L, v, ++k);
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) != (lua_Integer)wire_get_i64(f->val + off))
                fz_fail("an INTS item decoded wrong");
            lua_pop(L, 1);
        }
        if (count_keys(L, v) != k) fz_fail("an INTS table has extra entries");
        break;
    case WIRE_MAP: {
        /* the last pair of a key wins */
        size_t o2;
        const unsigned char *key, *val, *k2, *v2;
        size_t kl, vl, k2l, v2l;
        lua_Integer distinct = 0;
        if (lua_type(L, v) != LUA_TTABLE) fz_fail("a MAP field is not a table");
        while (wire_next_item(f, &off, &key, &kl)) {
            int last = 1;
            if (!wire_next_item(f, &off, &val, &vl)) fz_fail("a checked MAP has an odd item count");
            o2 = off;
            while (wire_next_item(f, &o2, &k2, &k2l) && wire_next_item(f, &o2, &v2, &v2l))
                if (k2l == kl && memcmp(k2, key, kl) == 0) { last = 0; break; }
            if (!last) continue;
            distinct++;
            lua_pushlstring(L, (const char *)key, kl);
            lua_rawget(L, v);
            if (!same_bytes(L, -1, val, vl)) fz_fail("a MAP pair decoded wrong");
            lua_pop(L, 1);
        }
        if (count_keys(L, v) != distinct) fz_fail("a MAP table has other keys");
        break;
    }
    default:
        fz_fail("wire_parse let type %d through", f->type);
    }
}

/* Checks the reply table at t against the parsed message. */
static void check_reply(lua_State *L, int t, const wire_msg *m) {
    int i, j;
    lua_Integer distinct = 0;
    t = lua_absindex(L, t);
    if (lua_type(L, t) != LUA_TTABLE) fz_fail("a reply is not a table");
    for (i = 0; i < m->nfields; i++) {
        const wire_field *f = &m->fields[i];
        for (j = i + 1; j < m->nfields; j++)
            if (m->fields[j].key_len == f->key_len && memcmp(m->fields[j].key, f->key, f->key_len) == 0) break;
        if (j < m->nfields) continue;   /* a later field of the same key wins */
        distinct++;
        lua_pushlstring(L, f->key, f->key_len);
        lua_rawget(L, t);
        check_value(L, -1, f);
        lua_pop(L, 1);
    }
    if (count_keys(L, t) != distinct) fz_fail("a reply table has other keys than its fields");
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------ mode 0 */

static void mode_body(lua_State *L, const uint8_t *data, size_t size) {
    wire_msg m;
    if (wire_parse(data, size, &m) != 0) return;
    lua_pushcfunction(L, chan_decode);
    lua_pushlightuserdata(L, &m);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("chan_decode raised: %s", fz_describe(L, -1));
    check_reply(L, -1, &m);
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------ mode 1 */

enum { EV_REPLY = 1, EV_FAIL, EV_CLOSE };

#define MAX_EVENTS 64

typedef struct {
    int kind;
    uint32_t id;
    const uint8_t *body;
    size_t len;
} event;

static struct {
    event ev[MAX_EVENTS];
    int nexp, nseen;
    const char *reason;
} st;

/* The callback of call id (upvalue 1), or on_close (upvalue 1 = 0). */
static int on_event(lua_State *L) {
    uint32_t id = (uint32_t)lua_tointeger(L, lua_upvalueindex(1));
    const event *e;
    if (st.nseen >= st.nexp) fz_fail("a callback (id %u) beyond the %d expected", id, st.nexp);
    e = &st.ev[st.nseen++];
    if (id == 0) {
        const char *r;
        if (e->kind != EV_CLOSE) fz_fail("on_close came too early (event %d)", st.nseen);
        if (!fz_is_coded(L, 1, "SANDBOX_ERROR")) fz_fail("on_close without a SANDBOX_ERROR");
        lua_getfield(L, 1, "reason");
        r = lua_tostring(L, -1);
        if (r == NULL || strcmp(r, st.reason) != 0) fz_fail("on_close reason %s, expected %s", r ? r : "none", st.reason);
        return 0;
    }
    if (e->id != id) fz_fail("callback of id %u, expected %u", id, e->id);
    if (e->kind == EV_REPLY) {
        wire_msg m;
        if (lua_isnil(L, 1)) fz_fail("call %u failed, expected its reply", id);
        if (wire_parse(e->body, e->len, &m) != 0) fz_fail("the model's frame does not parse");
        check_reply(L, 1, &m);
    } else {
        const char *r;
        if (!lua_isnil(L, 1) || !fz_is_coded(L, 2, "SANDBOX_ERROR")) fz_fail("call %u got a reply, expected to fail", id);
        lua_getfield(L, 2, "reason");
        r = lua_tostring(L, -1);
        if (r == NULL || strcmp(r, st.reason) != 0) fz_fail("call failed with reason %s, expected %s", r ? r : "none", st.reason);
    }
    return 0;
}

static void expect(int kind, uint32_t id, const uint8_t *body, size_t len) {
    if (st.nexp >= MAX_EVENTS) fz_fail("too many events");
    st.ev[st.nexp].kind = kind;
    st.ev[st.nexp].id = id;
    st.ev[st.nexp].body = body;
    st.ev[st.nexp].len = len;
    st.nexp++;
}

static void mode_stream(lua_State *L, const uint8_t *data, size_t size) {
    static const size_t chunks[8] = { 1, 2, 3, 5, 8, 64, 4096, 65536 };
    size_t max_frame, pos = 0, off = 0;
    unsigned npend, i, c1, c2, nchunk = 0;
    int pending[8] = {0};
    mc_chan *ch;
    uv_buf_t buf;
    if (size < 3) return;
    max_frame = data[0] < 128 ? 4 + (size_t)data[0] * 64 : (size_t)CHAN_DEFAULT_MAX_FRAME;
    c1 = data[1];
    npend = data[2] % 8;
    c2 = data[2] / 8;
    data += 3;
    size -= 3;

    /* the model */
    memset(&st, 0, sizeof st);
    for (i = 1; i <= npend; i++) pending[i] = 1;
    st.reason = "gone";
    while (size - off >= 4) {
        uint32_t flen = wire_get_u32(data + off);
        wire_msg m;
        if (flen < 4 || flen > max_frame) { st.reason = "failed"; break; }
        if (size - off - 4 < flen) break;
        if (wire_parse(data + off + 4, flen, &m) != 0) { st.reason = "failed"; break; }
        if (m.id == 0 || m.id > 7 || !pending[m.id]) { st.reason = "failed"; break; }
        pending[m.id] = 0;
        expect(EV_REPLY, m.id, data + off + 4, flen);
        off += 4 + (size_t)flen;
    }
    for (i = 1; i <= npend; i++)
        if (pending[i]) expect(EV_FAIL, i, NULL, 0);
    expect(EV_CLOSE, 0, NULL, 0);

    /* the channel: options, then pending calls */
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)max_frame);
    lua_setfield(L, -2, "max_frame_bytes");
    lua_pushinteger(L, 0);
    lua_pushcclosure(L, on_event, 1);
    lua_setfield(L, -2, "on_close");
    ch = chan_new(L, lua_gettop(L));   /* pushes the userdata, which the stack keeps */
    ch->pipe.data = ch;                /* the uv handle is never initialised: handle_live stays 0 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, ch->pending_ref);
    for (i = 1; i <= npend; i++) {
        lua_pushinteger(L, (lua_Integer)i);
        lua_pushcclosure(L, on_event, 1);
        lua_rawseti(L, -2, (lua_Integer)i);
    }
    lua_pop(L, 1);
    ch->npending = npend;
    ch->next_id = npend + 1;

    while (pos < size && !ch->closed) {
        size_t want = chunks[(c1 + nchunk * c2) % 8], n;
        nchunk++;
        chan_alloc((uv_handle_t *)&ch->pipe, 65536, &buf);
        if (buf.base == NULL) fz_fail("chan_alloc gave no buffer");
        n = size - pos < want ? size - pos : want;
        if (n > buf.len) n = buf.len;
        memcpy(buf.base, data + pos, n);
        chan_on_read((uv_stream_t *)&ch->pipe, (ssize_t)n, &buf);
        pos += n;
    }
    if (!ch->closed) {
        buf = uv_buf_init(NULL, 0);
        chan_on_read((uv_stream_t *)&ch->pipe, UV_EOF, &buf);
    }
    if (st.nseen != st.nexp) fz_fail("%d callbacks, expected %d", st.nseen, st.nexp);
    if (getenv("FUZZ_VERBOSE") != NULL) fprintf(stderr, "stream: %d events, closed %s\n", st.nexp, st.reason);
    if (ch->npending != 0) fz_fail("calls left pending after the close");
    /* the userdata is collected by fz_end; its __gc frees ch */
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------ mode 2 */

#include "fuzz_input.h"

static void push_bytes(lua_State *L, input *in, size_t max) {
    const uint8_t *p;
    int n = next(in);
    size_t got = take(in, n < 0 ? 0 : (size_t)n % (max + 1), &p);
    lua_pushlstring(L, (const char *)p, got);
}

static void push_int(lua_State *L, input *in) {
    const uint8_t *p;
    size_t n = take(in, 8, &p), i;
    uint64_t v = 0;
    for (i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    lua_pushinteger(L, (lua_Integer)v);
}

/* Pushes a request value shaped by the input: mostly ones that can be sent, some that cannot. */
static void push_value(lua_State *L, input *in) {
    int op = next(in), n, i;
    n = next(in);
    n = n < 0 ? 0 : n % 6;
    switch ((op < 0 ? 0 : op) % 10) {
    case 0: push_bytes(L, in, 40); break;
    case 1: push_int(L, in); break;
    case 2: lua_pushboolean(L, n & 1); break;
    case 3:
        lua_createtable(L, n, 0);
        for (i = 1; i <= n; i++) { push_bytes(L, in, 12); lua_rawseti(L, -2, i); }
        break;
    case 4:
        lua_createtable(L, n, 0);
        for (i = 1; i <= n; i++) { push_int(L, in); lua_rawseti(L, -2, i); }
        break;
    case 5:
        lua_createtable(L, 0, n);
        for (i = 0; i < n; i++) { push_bytes(L, in, 6); push_bytes(L, in, 12); lua_rawset(L, -3); }
        break;
    case 6: lua_pushnumber(L, n & 1 ? 2.5 : 3.0); break;   /* never an integer */
    case 7: {   /* lists that are not lists: mixed, with a hole, with an extra key */
        lua_newtable(L);
        lua_pushliteral(L, "a");
        lua_rawseti(L, -2, 1);
        if (n % 3 == 0) lua_pushinteger(L, 2);
        else lua_pushliteral(L, "b");
        lua_rawseti(L, -2, n % 3 == 1 ? 3 : 2);
        if (n % 3 == 2) { lua_pushliteral(L, "x"); lua_setfield(L, -2, "k"); }
        break;
    }
    case 8:   /* a map with a value that is not a string, or a nested table */
        lua_newtable(L);
        if (n & 1) lua_pushinteger(L, 1);
        else lua_newtable(L);
        lua_setfield(L, -2, "k");
        break;
    default: lua_pushcfunction(L, on_event); break;
    }
}

/* Pushes the request table: keys from a small set, raw bytes, empty, too long, with a NUL. */
static void push_request(lua_State *L, input *in) {
    static const char *const keys[] = { "op", "path", "argv", "env", "data", "cwd", "stdin", "timeout_ms" };
    int b;
    lua_newtable(L);
    while ((b = next(in)) >= 0) {
        switch (b % 12) {
        case 8: push_bytes(L, in, 70); break;
        case 9: lua_pushliteral(L, ""); break;
        case 10: lua_pushlstring(L, "k\0k", 3); break;
        case 11: lua_pushinteger(L, b); break;
        default: lua_pushstring(L, keys[b % 12]); break;
        }
        push_value(L, in);
        lua_rawset(L, -3);
    }
}

/* Checks the parsed field f against the request value at v, as chan.c encodes values. */
static void check_sent(lua_State *L, int v, const wire_field *f) {
    size_t off = 0, len, n;
    const unsigned char *item;
    lua_Integer k = 0, i;
    v = lua_absindex(L, v);
    switch (lua_type(L, v)) {
    case LUA_TSTRING:
        if (f->type != WIRE_BYTES || !same_bytes(L, v, f->val, f->len)) fz_fail("a string was sent wrong");
        return;
    case LUA_TBOOLEAN:
        if (f->type != WIRE_BOOL || f->val[0] != (lua_toboolean(L, v) ? 1 : 0)) fz_fail("a boolean was sent wrong");
        return;
    case LUA_TNUMBER:
        if (f->type != WIRE_INT || wire_get_i64(f->val) != (int64_t)lua_tointeger(L, v)) fz_fail("an integer was sent wrong");
        return;
    case LUA_TTABLE: break;
    default: fz_fail("a %s was sent", luaL_typename(L, v));
    }
    n = lua_rawlen(L, v);
    if (n > 0 || count_keys(L, v) == 0) {
        lua_rawgeti(L, v, 1);
        if (n > 0 && lua_type(L, -1) == LUA_TNUMBER) {
            if (f->type != WIRE_INTS || f->len != n * 8) fz_fail("a list of integers was sent wrong");
            for (i = 1; i <= (lua_Integer)n; i++) {
                lua_rawgeti(L, v, i);
                if (wire_get_i64(f->val + (i - 1) * 8) != (int64_t)lua_tointeger(L, -1)) fz_fail("an integer item was sent wrong");
                lua_pop(L, 1);
            }
        } else {
            if (f->type != WIRE_STRS) fz_fail("a list of strings was sent as type %d", f->type);
            while (wire_next_item(f, &off, &item, &len)) {
                lua_rawgeti(L, v, ++k);
                if (!same_bytes(L, -1, item, len)) fz_fail("a string item was sent wrong");
                lua_pop(L, 1);
            }
            if ((size_t)k != n) fz_fail("a list was sent with %lld items of %zu", (long long)k, n);
        }
        lua_pop(L, 1);
        return;
    }
    if (f->type != WIRE_MAP) fz_fail("a map was sent as type %d", f->type);
    while (wire_next_item(f, &off, &item, &len)) {
        const unsigned char *val;
        size_t vl;
        if (!wire_next_item(f, &off, &val, &vl)) fz_fail("a map was sent with an odd item count");
        lua_pushlstring(L, (const char *)item, len);
        lua_rawget(L, v);
        if (!same_bytes(L, -1, val, vl)) fz_fail("a map pair was sent wrong");
        lua_pop(L, 1);
        k++;
    }
    if (k != count_keys(L, v)) fz_fail("a map was sent with %lld pairs", (long long)k);
}

static int replied;
static unsigned char *sent_frame;
static size_t sent_len;
/* The request had `more = true`: its echo is a streaming frame for a call that did not ask to
** stream, which the channel must take as a protocol error (core/wire.h, "Streaming"). */
static int echo_is_more;

static int on_reply(lua_State *L) {
    wire_msg m;
    replied++;
    if (echo_is_more) {
        if (!lua_isnil(L, 1) || strstr(fz_describe(L, 2), "not streaming") == NULL)
            fz_fail("a streaming frame for a plain call was not refused: %s", fz_describe(L, 2));
        return 0;
    }
    if (lua_isnil(L, 1)) fz_fail("the echoed reply did not arrive: %s", fz_describe(L, 2));
    if (wire_parse(sent_frame + 4, sent_len - 4, &m) != 0) fz_fail("the echo does not parse");
    check_reply(L, 1, &m);
    return 0;
}

static void run_loop(int times) {
    while (times-- > 0) uv_run(uv_default_loop(), UV_RUN_NOWAIT);
}

static void mode_request(lua_State *L, const uint8_t *data, size_t size) {
    input in = { data, size };
    int sv[2], req, chi, i;
    wire_msg m;
    lua_Integer id;
    size_t got = 0, cap = 1 << 16;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    fz_core_fn(L, NULL, "channel");
    lua_pushinteger(L, sv[0]);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK || lua_isnil(L, -1)) fz_fail("core.channel failed");
    chi = lua_gettop(L);
    push_request(L, &in);
    req = lua_gettop(L);
    lua_getfield(L, chi, "call");
    lua_pushvalue(L, chi);
    lua_pushvalue(L, req);
    lua_pushcfunction(L, on_reply);
    if (lua_pcall(L, 3, 1, 0) != LUA_OK) {
        if (!fz_is_coded(L, -1, "INVALID_INPUT")) fz_fail("ch:call raised something other than INVALID_INPUT: %s", fz_describe(L, -1));
        if (getenv("FUZZ_VERBOSE") != NULL) fprintf(stderr, "request refused: %s\n", fz_describe(L, -1));
        goto done;
    }
    if (!lua_isinteger(L, -1)) fz_fail("ch:call gave no id");
    id = lua_tointeger(L, -1);

    /* what reached the other end */
    sent_frame = (unsigned char *)malloc(cap);
    if (sent_frame == NULL) abort();
    for (i = 0; i < 100; i++) {
        ssize_t n = recv(sv[1], sent_frame + got, cap - got, MSG_DONTWAIT);
        if (n > 0) got += (size_t)n;
        if (got >= 4 && got - 4 >= wire_get_u32(sent_frame)) break;
        run_loop(1);
    }
    if (got < 4 || got - 4 != wire_get_u32(sent_frame)) fz_fail("the request did not arrive as one frame (%zu bytes)", got);
    sent_len = got;
    if (wire_parse(sent_frame + 4, got - 4, &m) != 0) fz_fail("wire_parse refused a request ch:call sent");
    if ((lua_Integer)m.id != id) fz_fail("the request went with id %u, call said %lld", m.id, (long long)id);
    if ((lua_Integer)m.nfields != count_keys(L, req)) fz_fail("%d fields sent for %lld keys", m.nfields, (long long)count_keys(L, req));
    for (i = 0; i < m.nfields; i++) {
        lua_pushlstring(L, m.fields[i].key, m.fields[i].key_len);
        lua_rawget(L, req);
        if (lua_isnil(L, -1)) fz_fail("a field was sent for no key");
        check_sent(L, -1, &m.fields[i]);
        lua_pop(L, 1);
    }

    /* the same frame back, as the reply */
    {
        const wire_field *more = wire_find(&m, "more");
        echo_is_more = more != NULL && more->type == WIRE_BOOL && more->len == 1 && more->val[0] == 1;
    }
    replied = 0;
    if (send(sv[1], sent_frame, got, MSG_DONTWAIT) != (ssize_t)got) fz_fail("cannot echo the frame");
    for (i = 0; i < 100 && !replied; i++) run_loop(1);
    if (replied != 1) fz_fail("the echoed reply reached the callback %d times", replied);
    if (getenv("FUZZ_VERBOSE") != NULL) fprintf(stderr, "request of %d fields sent and echoed\n", m.nfields);
    free(sent_frame);
    sent_frame = NULL;
done:
    lua_getfield(L, chi, "close");
    lua_pushvalue(L, chi);
    lua_call(L, 1, 0);
    close(sv[1]);
    fz_end(L);
    run_loop(4);
}

/* }------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0: mode_body(L, data + 1, size - 1); break;
    case 1: mode_stream(L, data + 1, size - 1); break;
    default: mode_request(L, data + 1, size - 1); break;
    }
    fz_end(L);
    return 0;
}
