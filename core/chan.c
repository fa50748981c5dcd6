/*
** chan.c: channels to the in-sandbox agent, for mayura.core.
**
** core.channel(fd, opts) wraps a connected unix stream socket (e.g. one end
** of core.socketpair()); core.channel_connect(path, opts, cb) connects to
** an agent listening on a socket path. ch:call(request, cb[, max_reply_bytes])
** sends a request frame (core/wire.h) built from a Lua table and calls
** cb(reply) when the reply with the same id comes back, or cb(nil, err) when
** the channel closes first. ch:call(request, cb, max_reply_bytes, on_more)
** makes a streaming call: a frame with that id carrying `more = true`
** (core/wire.h, "Streaming") is passed to on_more(frame) and the call stays
** pending until the frame without it; such a frame for a call that gave no
** on_more is a protocol error (the channel closes, 'failed').
**
** Under a host's step with a budget (mc_step), a channel stops reading once the budget is spent
** and reads again at the next step (chan_resume_reads), and each read takes at most
** CHAN_READ_MAX bytes: the replies of several sandboxes moving files are spread over frames.
** The receive buffer is kept, warm, between frames of up to CHAN_KEEP bytes (a file's part).
**
** What comes back is untrusted: code in the sandbox runs as the agent's
** user and may replace it. So a frame longer than max_frame_bytes (or than
** the max_reply_bytes of the call it answers, told by its id before the rest
** is read), a frame wire_parse refuses, or a reply to no pending call closes
** the channel (reason 'failed') instead of being believed, and decoding runs
** in protected mode, so even running out of memory on a hostile reply cannot
** unwind through libuv.
*/
#include "mc.h"
#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

#define CHAN_MT "mayura.channel"
#define CHAN_DEFAULT_MAX_FRAME ((lua_Integer)64 << 20)
#define CHAN_READ_CHUNK 65536
#define CHAN_READ_MAX ((size_t)256 << 10)
#define CHAN_KEEP ((size_t)2 << 20)

typedef struct mc_chan {
    uv_pipe_t pipe;
    uv_connect_t connect_req;
    lua_State *L;         /* main thread; NULL once the state is closing */
    int self_ref;         /* anchors the userdata while the channel is open */
    int pending_ref;      /* table: id -> callback */
    int more_ref;         /* table: id -> on_more, for the pending streaming calls */
    int on_close_ref;
    int connect_cb_ref;   /* channel_connect: the callback, until connected */
    uint32_t next_id;
    lua_Integer npending;
    size_t max_frame;
    struct { uint32_t id; size_t max; } *limits;   /* pending calls with a max_reply_bytes of their own */
    size_t nlimits, limits_cap;
    unsigned char *in;    /* received bytes not yet handled */
    size_t in_len, in_size;
    int closed;           /* no more calls; the pending ones have been failed */
    mc_life life;         /* uv: the pipe (0 or 1); holds: the Lua userdata, each callback into Lua under way */
    int paused;           /* reading stopped until the next step; in chan_paused */
    unsigned paused_gen;  /* chan_resume_gen when it stopped */
    struct mc_chan *paused_prev, *paused_next;
} mc_chan;

/* The channels that stopped reading for the rest of a step (a list through paused_prev/next). */
static mc_chan *chan_paused = NULL;
/* How many times chan_resume_reads has begun: one that stopped while it runs waits for the next. */
static unsigned chan_resume_gen = 0;

typedef struct { mc_chan *ch; } chan_box;

static const mc_class chan_class;   /* at the end of the file */

typedef struct chan_write {
    uv_write_t req;
    mc_chan *ch;
    unsigned char *data;
} chan_write;

/* {======================================================
** Lifetime
** =======================================================*/

static void chan_unpause(mc_chan *ch) {
    if (!ch->paused) return;
    if (ch->paused_prev != NULL) ch->paused_prev->paused_next = ch->paused_next;
    else chan_paused = ch->paused_next;
    if (ch->paused_next != NULL) ch->paused_next->paused_prev = ch->paused_prev;
    ch->paused_prev = ch->paused_next = NULL;
    ch->paused = 0;
}

static void chan_maybe_free(mc_chan *ch) {
    if (!mc_life_over(&ch->life)) return;
    chan_unpause(ch);
    free(ch->limits);
    free(ch->in);
    free(ch);
}

static void chan_on_handle_close(uv_handle_t *h) {
    mc_chan *ch = (mc_chan *)h->data;
    ch->life.uv--;
    chan_maybe_free(ch);
}

static void chan_close_handle(mc_chan *ch) {
    if (ch->life.uv > 0 && !uv_is_closing((uv_handle_t *)&ch->pipe))
        uv_close((uv_handle_t *)&ch->pipe, chan_on_handle_close);
}

static void chan_push_error(lua_State *L, const char *reason, const char *msg) {
    mc_push_error(L, "SANDBOX_ERROR", "%s", msg);
    mc_error_field(L, "reason", reason);
}

static int chan_id_cmp(const void *a, const void *b) {
    lua_Integer x = *(const lua_Integer *)a, y = *(const lua_Integer *)b;
    return x < y ? -1 : x > y;
}

/*
** Closes the channel once: stops the handle, fails every pending call with
** (nil, SANDBOX_ERROR reason) in id order, then calls on_close(err) unless
** the owner closed it. Callbacks run on L: the main thread from the loop,
** the caller's thread from ch:close(). ch stays valid throughout (busy).
*/
static void chan_shutdown(mc_chan *ch, lua_State *L, const char *reason, const char *msg, int notify) {
    int pending, on_close, self;
    lua_Integer npending = ch->npending;
    if (ch->closed) return;
    ch->closed = 1;
    chan_unpause(ch);
    if (ch->life.uv > 0 && !uv_is_closing((uv_handle_t *)&ch->pipe))
        uv_read_stop((uv_stream_t *)&ch->pipe);
    chan_close_handle(ch);
    pending = ch->pending_ref;
    on_close = ch->on_close_ref;
    self = ch->self_ref;
    if (L != NULL && ch->more_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, ch->more_ref);
    ch->pending_ref = ch->on_close_ref = ch->self_ref = ch->more_ref = LUA_NOREF;
    ch->npending = 0;
    ch->nlimits = 0;
    if (L == NULL) return;   /* the state is closing: nobody to tell */
    ch->life.holds++;
    if (pending != LUA_NOREF) {
        /* in id order, so that callers see their calls fail in the order they made them */
        lua_Integer *ids = npending > 0 ? (lua_Integer *)malloc((size_t)npending * sizeof *ids) : NULL;
        size_t n = 0, i;
        int t;
        lua_rawgeti(L, LUA_REGISTRYINDEX, pending);
        luaL_unref(L, LUA_REGISTRYINDEX, pending);
        t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t) != 0) {
            if (ids != NULL && n < (size_t)npending) {
                ids[n++] = lua_tointeger(L, -2);
                lua_pop(L, 1);
            } else {
                /* no memory to sort: answer in table order (clearing a field while traversing is allowed) */
                lua_pushnil(L);
                chan_push_error(L, reason, msg);
                mc_call(L, 2);
                lua_pushvalue(L, -1);
                lua_pushnil(L);
                lua_rawset(L, t);
            }
        }
        if (n > 1) qsort(ids, n, sizeof *ids, chan_id_cmp);
        for (i = 0; i < n; i++) {
            lua_rawgeti(L, t, ids[i]);
            lua_pushnil(L);
            chan_push_error(L, reason, msg);
            mc_call(L, 2);
        }
        free(ids);
        lua_pop(L, 1);
    }
    if (on_close != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, on_close);
        luaL_unref(L, LUA_REGISTRYINDEX, on_close);
        if (notify) {
            chan_push_error(L, reason, msg);
            mc_call(L, 1);
        } else {
            lua_pop(L, 1);
        }
    }
    /* unanchored last: the userdata may be collected from here on */
    if (self != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, self);
    ch->life.holds--;
}

/* }====================================================== */

/* {======================================================
** Reading replies
** =======================================================*/

/* The max_reply_bytes of the pending call id (0: none but max_frame_bytes); forgets it when take. */
static size_t chan_limit(mc_chan *ch, uint32_t id, int take) {
    size_t i, max;
    for (i = 0; i < ch->nlimits; i++) {
        if (ch->limits[i].id != id) continue;
        max = ch->limits[i].max;
        if (take) ch->limits[i] = ch->limits[--ch->nlimits];
        return max;
    }
    return 0;
}

/* Protected: pushes the reply table of the wire_msg given as a light userdata. */
static int chan_decode(lua_State *L) {
    const wire_msg *m = (const wire_msg *)lua_touserdata(L, 1);
    int i;
    lua_createtable(L, 0, m->nfields);
    for (i = 0; i < m->nfields; i++) {
        const wire_field *f = &m->fields[i];
        size_t off = 0, len;
        const unsigned char *item;
        lua_Integer k = 0;
        lua_pushlstring(L, f->key, f->key_len);
        switch (f->type) {
        case WIRE_BYTES:
            lua_pushlstring(L, (const char *)f->val, f->len);
            break;
        case WIRE_INT:
            lua_pushinteger(L, (lua_Integer)wire_get_i64(f->val));
            break;
        case WIRE_BOOL:
            lua_pushboolean(L, f->val[0]);
            break;
        case WIRE_STRS:
            lua_newtable(L);
            while (wire_next_item(f, &off, &item, &len)) {
                lua_pushlstring(L, (const char *)item, len);
                lua_rawseti(L, -2, ++k);
            }
            break;
        case WIRE_INTS:
            lua_createtable(L, (int)(f->len / 8 < INT_MAX ? f->len / 8 : 0), 0);
            for (off = 0; off + 8 <= f->len; off += 8) {
                lua_pushinteger(L, (lua_Integer)wire_get_i64(f->val + off));
                lua_rawseti(L, -2, ++k);
            }
            break;
        case WIRE_MAP:
            lua_newtable(L);
            while (wire_next_item(f, &off, &item, &len)) {
                const unsigned char *v;
                size_t vl;
                lua_pushlstring(L, (const char *)item, len);
                if (!wire_next_item(f, &off, &v, &vl)) { lua_pop(L, 1); break; }
                lua_pushlstring(L, (const char *)v, vl);
                lua_rawset(L, -3);
            }
            break;
        default:   /* wire_parse lets no other type through */
            lua_pushnil(L);
            break;
        }
        lua_rawset(L, -3);
    }
    return 1;
}

/*
** Handles one frame body. Returns 0, or -1 after closing the channel on a
** protocol error. May call into Lua (the reply's callback).
*/
static int chan_handle_frame(mc_chan *ch, const unsigned char *body, size_t len) {
    lua_State *L = ch->L;
    wire_msg msg;
    if (wire_parse(body, len, &msg) != 0) {
        chan_shutdown(ch, L, "failed", "the agent sent a malformed frame", 1);
        return -1;
    }
    if (L == NULL) return -1;
    lua_pushcfunction(L, chan_decode);
    lua_pushlightuserdata(L, &msg);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        chan_shutdown(ch, L, "failed", "the agent's reply could not be decoded", 1);
        return -1;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, ch->pending_ref);   /* reply, pending */
    lua_rawgeti(L, -1, (lua_Integer)msg.id);              /* reply, pending, cb */
    if (msg.id == 0 || lua_type(L, -1) != LUA_TFUNCTION) {
        lua_pop(L, 3);
        chan_shutdown(ch, L, "failed", "the agent sent a reply to no pending call", 1);
        return -1;
    }
    {
        const wire_field *more = wire_find(&msg, "more");
        if (more != NULL && more->type == WIRE_BOOL && more->val[0] == 1) {
            /* a frame of a streaming call: to its on_more; the call stays pending */
            lua_pop(L, 2);                                        /* reply */
            lua_rawgeti(L, LUA_REGISTRYINDEX, ch->more_ref);      /* reply, more */
            lua_rawgeti(L, -1, (lua_Integer)msg.id);              /* reply, more, on_more */
            if (lua_type(L, -1) != LUA_TFUNCTION) {
                lua_pop(L, 3);
                chan_shutdown(ch, L, "failed", "the agent streamed to a call that is not streaming", 1);
                return -1;
            }
            lua_replace(L, -2);                                   /* reply, on_more */
            lua_insert(L, -2);                                    /* on_more, reply */
            mc_call(L, 1);
            return 0;
        }
    }
    if (ch->more_ref != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, ch->more_ref);
        lua_pushnil(L);
        lua_rawseti(L, -2, (lua_Integer)msg.id);
        lua_pop(L, 1);
    }
    lua_pushnil(L);
    lua_rawseti(L, -3, (lua_Integer)msg.id);
    ch->npending--;
    if (ch->nlimits > 0) chan_limit(ch, msg.id, 1);
    lua_replace(L, -2);                                   /* reply, cb */
    lua_insert(L, -2);                                    /* cb, reply */
    mc_call(L, 1);
    return 0;
}

static void chan_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    mc_chan *ch = (mc_chan *)h->data;
    (void)suggested;
    if (ch->in_size - ch->in_len < CHAN_READ_CHUNK) {
        /* grows with the bytes that came, never to a declared length at once */
        size_t ns = ch->in_size ? ch->in_size * 2 : 2 * CHAN_READ_CHUNK;
        unsigned char *nb;
        if (ns - ch->in_len < CHAN_READ_CHUNK) ns = ch->in_len + CHAN_READ_CHUNK;
        nb = (unsigned char *)realloc(ch->in, ns);
        if (nb == NULL) { buf->base = NULL; buf->len = 0; return; }   /* read_cb gets UV_ENOBUFS */
        ch->in = nb;
        ch->in_size = ns;
    }
    buf->base = (char *)ch->in + ch->in_len;
    buf->len = ch->in_size - ch->in_len;
    if (buf->len > CHAN_READ_MAX) buf->len = CHAN_READ_MAX;
}

/* Stops reading until the next step (chan_resume_reads). */
static void chan_pause(mc_chan *ch) {
    if (ch->paused || ch->closed || ch->life.uv == 0) return;
    uv_read_stop((uv_stream_t *)&ch->pipe);
    ch->paused = 1;
    ch->paused_gen = chan_resume_gen;
    ch->paused_prev = NULL;
    ch->paused_next = chan_paused;
    if (chan_paused != NULL) chan_paused->paused_prev = ch;
    chan_paused = ch;
}

/*
** Handles the complete frames received. Once the step's budget is spent, the frames left (and
** what is still in the socket) wait for the next step: the channel stops reading until then.
*/
static void chan_handle_frames(mc_chan *ch) {
    size_t off = 0;
    ch->life.holds++;
    while (!ch->closed && ch->in_len - off >= 4) {
        uint32_t flen = wire_get_u32(ch->in + off);
        if (flen < 4 || flen > ch->max_frame) {
            chan_shutdown(ch, ch->L, "failed", "the agent sent a frame over the size limit", 1);
            break;
        }
        if (ch->nlimits > 0) {
            size_t max;
            if (ch->in_len - off < 8) break;   /* its id first: the call it answers may allow less */
            max = chan_limit(ch, wire_get_u32(ch->in + off + 4), 0);
            if (max != 0 && flen > max) {
                chan_shutdown(ch, ch->L, "failed", "the agent sent a reply over its call's size limit", 1);
                break;
            }
        }
        if (ch->in_len - off - 4 < flen) break;
        if (mc_step_over()) break;
        off += 4;
        /* the bytes stay put while Lua runs: ch->in is only moved or freed below */
        if (chan_handle_frame(ch, ch->in + off, flen) != 0) break;
        off += flen;
    }
    if (!ch->closed && off > 0) {
        memmove(ch->in, ch->in + off, ch->in_len - off);
        ch->in_len -= off;
        if (ch->in_size > CHAN_KEEP && ch->in_len < CHAN_READ_CHUNK) {
            /* a frame larger than a file's part is done: give its buffer back */
            unsigned char *nb = (unsigned char *)realloc(ch->in, 2 * CHAN_READ_CHUNK);
            if (nb != NULL) { ch->in = nb; ch->in_size = 2 * CHAN_READ_CHUNK; }
        }
    }
    if (mc_step_over()) chan_pause(ch);
    ch->life.holds--;
    chan_maybe_free(ch);
}

static void chan_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    mc_chan *ch = (mc_chan *)s->data;
    (void)buf;
    if (ch->closed) return;
    if (nread < 0) {
        if (nread == UV_ENOBUFS) chan_shutdown(ch, ch->L, "failed", MC_OOM_MSG " reading from the agent", 1);
        else chan_shutdown(ch, ch->L, "gone", "the agent closed the connection", 1);
        return;
    }
    ch->in_len += (size_t)nread;
    chan_handle_frames(ch);
}

/*
** The channels that stopped for the rest of a step read again, and handle the frames they had
** received: at the next step, or when the loop is run otherwise.
*/
static void chan_resume_reads(void) {
    unsigned gen = ++chan_resume_gen;
    for (;;) {
        mc_chan *ch = chan_paused;
        /* the list may change under each channel's callbacks: look for the next from its head */
        while (ch != NULL && ch->paused_gen == gen) ch = ch->paused_next;
        if (ch == NULL) break;
        chan_unpause(ch);
        if (ch->closed || ch->life.uv == 0 || uv_is_closing((uv_handle_t *)&ch->pipe)) continue;
        if (uv_read_start((uv_stream_t *)&ch->pipe, chan_alloc, chan_on_read) != 0) {
            chan_shutdown(ch, ch->L, "gone", "cannot read from the agent", 1);
            continue;
        }
        chan_handle_frames(ch);   /* may free ch */
    }
}

/* }====================================================== */

/* {======================================================
** Writing requests
** =======================================================*/

static void chan_on_write(uv_write_t *req, int status) {
    chan_write *w = (chan_write *)req->data;
    mc_chan *ch = w->ch;
    free(w->data);
    free(w);
    if (status < 0 && status != UV_ECANCELED && !ch->closed)
        chan_shutdown(ch, ch->L, "gone", "cannot write to the agent", 1);
}

/* The wire type a request value will be encoded as, or -1 (with *why set). */
static int chan_value_type(lua_State *L, int idx, const char **why) {
    lua_Integer n, count = 0;
    int kind = 0;   /* of the list items: LUA_TSTRING or LUA_TNUMBER */
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: return WIRE_BYTES;
    case LUA_TBOOLEAN: return WIRE_BOOL;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) return WIRE_INT;
        *why = "is a number that is not an integer";
        return -1;
    case LUA_TTABLE: break;
    default:
        *why = "has a type that cannot be sent";
        return -1;
    }
    idx = lua_absindex(L, idx);
    n = (lua_Integer)lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        count++;
        if (n > 0) {
            int vt = lua_type(L, -1);
            if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n ||
                (vt != LUA_TSTRING && !(vt == LUA_TNUMBER && lua_isinteger(L, -1))) ||
                (kind != 0 && kind != vt)) {
                lua_pop(L, 2);
                *why = "is not a list of only strings or only integers";
                return -1;
            }
            kind = vt;
        } else if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING) {
            lua_pop(L, 2);
            *why = "is not a list, nor a map of strings to strings";
            return -1;
        }
        lua_pop(L, 1);
    }
    if (n > 0 && count != n) { *why = "is a list with holes or extra keys"; return -1; }
    if (count == 0) return WIRE_STRS;
    if (n == 0) return WIRE_MAP;
    return kind == LUA_TSTRING ? WIRE_STRS : WIRE_INTS;
}

/* Encodes the value at idx (already checked) as field key. Raises nothing. */
static void chan_encode_value(lua_State *L, wire_buf *b, const char *key, int idx, int type) {
    size_t len, at;
    const char *s;
    lua_Integer i, n;
    idx = lua_absindex(L, idx);
    switch (type) {
    case WIRE_BYTES:
        s = lua_tolstring(L, idx, &len);
        wire_add_bytes(b, key, s, len);
        break;
    case WIRE_BOOL:
        wire_add_bool(b, key, lua_toboolean(L, idx));
        break;
    case WIRE_INT:
        wire_add_int(b, key, (int64_t)lua_tointeger(L, idx));
        break;
    case WIRE_STRS:
    case WIRE_INTS:
        at = wire_open_list(b, key, type);
        n = (lua_Integer)lua_rawlen(L, idx);
        for (i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, i);
            if (type == WIRE_STRS) {
                s = lua_tolstring(L, -1, &len);
                wire_item(b, s, len);
            } else {
                wire_int_item(b, (int64_t)lua_tointeger(L, -1));
            }
            lua_pop(L, 1);
        }
        wire_close_list(b, at);
        break;
    case WIRE_MAP:
        at = wire_open_list(b, key, type);
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) {
            s = lua_tolstring(L, -2, &len);
            wire_item(b, s, len);
            s = lua_tolstring(L, -1, &len);
            wire_item(b, s, len);
            lua_pop(L, 1);
        }
        wire_close_list(b, at);
        break;
    default:
        break;
    }
}

/* }====================================================== */

/* {======================================================
** Lua API
** =======================================================*/

static mc_chan *chan_check(lua_State *L) {
    chan_box *box = (chan_box *)luaL_checkudata(L, 1, CHAN_MT);
    return box->ch;
}

/*
** ch:call(request, cb[, max_reply_bytes]) -> id. The request table is
** checked in full before anything is built (a misuse raises and leaves
** nothing allocated). With max_reply_bytes (4 or more), a reply frame longer
** than that closes the channel as one over max_frame_bytes does. On a closed
** channel: nil, err (SANDBOX_ERROR reason 'gone'), and cb is never called.
*/
static int l_chan_call(lua_State *L) {
    mc_chan *ch = chan_check(L);
    wire_buf b = {0};
    chan_write *w;
    uv_buf_t ub;
    uint32_t id;
    int nfields = 0, rc;
    lua_Integer max_reply = 0;
    if (lua_type(L, 2) != LUA_TTABLE) return mc_raise(L, "INVALID_INPUT", "call expects a request table");
    if (lua_type(L, 3) != LUA_TFUNCTION) return mc_raise(L, "INVALID_INPUT", "call expects a callback");
    if (!lua_isnoneornil(L, 4)) {
        if (!lua_isinteger(L, 4) || (max_reply = lua_tointeger(L, 4)) < 4 || max_reply > (lua_Integer)WIRE_MAX_FRAME)
            return mc_raise(L, "INVALID_INPUT", "max_reply_bytes must be an integer from 4 to %u", WIRE_MAX_FRAME);
    }
    if (!lua_isnoneornil(L, 5) && lua_type(L, 5) != LUA_TFUNCTION)
        return mc_raise(L, "INVALID_INPUT", "on_more must be a function");
    lua_pushnil(L);
    while (lua_next(L, 2) != 0) {
        const char *why = NULL;
        size_t kl;
        if (lua_type(L, -2) != LUA_TSTRING) return mc_raise(L, "INVALID_INPUT", "request keys must be strings");
        lua_tolstring(L, -2, &kl);
        if (kl == 0 || kl > WIRE_MAX_KEY)
            return mc_raise(L, "INVALID_INPUT", "request key '%s' must be 1 to %d bytes", lua_tostring(L, -2), WIRE_MAX_KEY);
        if (strlen(lua_tostring(L, -2)) != kl)
            return mc_raise(L, "INVALID_INPUT", "a request key contains a NUL byte");
        if (chan_value_type(L, -1, &why) < 0)
            return mc_raise(L, "INVALID_INPUT", "request field '%s' %s", lua_tostring(L, -2), why);
        if (++nfields > WIRE_MAX_FIELDS)
            return mc_raise(L, "INVALID_INPUT", "a request has at most %d fields", WIRE_MAX_FIELDS);
        lua_pop(L, 1);
    }
    if (ch == NULL || ch->closed || ch->L == NULL) {
        lua_pushnil(L);
        chan_push_error(L, "gone", "the channel is closed");
        return 2;
    }
    if (max_reply > 0 && ch->nlimits == ch->limits_cap) {
        size_t nc = ch->limits_cap ? ch->limits_cap * 2 : 8;
        void *nl = realloc(ch->limits, nc * sizeof *ch->limits);
        if (nl == NULL) return mc_raise_oom(L);
        ch->limits = nl;
        ch->limits_cap = nc;
    }
    id = ch->next_id++;
    if (ch->next_id == 0) ch->next_id = 1;   /* 0 is never an id */

    wire_begin(&b, id);
    lua_pushnil(L);
    while (lua_next(L, 2) != 0) {
        const char *why = NULL;
        chan_encode_value(L, &b, lua_tostring(L, -2), -1, chan_value_type(L, -1, &why));
        lua_pop(L, 1);
    }
    if (wire_end(&b) != 0) {
        free(b.data);
        return mc_raise(L, "INVALID_INPUT", "the request cannot be built: larger than a frame, or out of memory");
    }
    w = (chan_write *)calloc(1, sizeof *w);
    if (w == NULL) {
        free(b.data);
        return mc_raise_oom(L);
    }
    w->ch = ch;
    w->data = b.data;
    w->req.data = w;
    ub = uv_buf_init((char *)b.data, (unsigned int)b.len);
    rc = uv_write(&w->req, (uv_stream_t *)&ch->pipe, &ub, 1, chan_on_write);
    if (rc != 0) {
        free(w->data);
        free(w);
        chan_shutdown(ch, L, "gone", "cannot write to the agent", 1);
        lua_pushnil(L);
        chan_push_error(L, "gone", "cannot write to the agent");
        return 2;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, ch->pending_ref);
    lua_pushvalue(L, 3);
    lua_rawseti(L, -2, (lua_Integer)id);
    lua_pop(L, 1);
    if (lua_type(L, 5) == LUA_TFUNCTION) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, ch->more_ref);
        lua_pushvalue(L, 5);
        lua_rawseti(L, -2, (lua_Integer)id);
        lua_pop(L, 1);
    }
    ch->npending++;
    if (max_reply > 0) {   /* room was made above */
        ch->limits[ch->nlimits].id = id;
        ch->limits[ch->nlimits].max = (size_t)max_reply;
        ch->nlimits++;
    }
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

/* ch:close(): every pending call gets (nil, SANDBOX_ERROR 'gone'); on_close is not called. */
static int l_chan_close(lua_State *L) {
    mc_chan *ch = chan_check(L);
    if (ch != NULL && !ch->closed) chan_shutdown(ch, L, "gone", "the channel was closed", 0);
    return 0;
}

static int l_chan_pending(lua_State *L) {
    mc_chan *ch = chan_check(L);
    lua_pushinteger(L, ch != NULL && !ch->closed ? ch->npending : 0);
    return 1;
}

static int l_chan_is_closed(lua_State *L) {
    mc_chan *ch = chan_check(L);
    lua_pushboolean(L, ch == NULL || ch->closed);
    return 1;
}

static int l_chan_tostring(lua_State *L) {
    mc_chan *ch = chan_check(L);
    lua_pushfstring(L, CHAN_MT " (%s)", ch == NULL || ch->closed ? "closed" : "open");
    return 1;
}

/*
** An open channel is anchored, so this runs for an open one only while the
** state closes: the handle is closed and no callback may reach the state.
*/
static int l_chan_gc(lua_State *L) {
    chan_box *box = (chan_box *)luaL_checkudata(L, 1, CHAN_MT);
    mc_chan *ch = box->ch;
    if (ch == NULL) return 0;
    box->ch = NULL;
    ch->life.holds--;   /* the userdata's */
    if (!ch->closed) chan_shutdown(ch, NULL, "gone", "", 0);
    ch->L = NULL;
    chan_maybe_free(ch);
    return 0;
}

static const char *const chan_keys[] = { "max_frame_bytes", "on_close", NULL };

/*
** Allocates a channel and its userdata (pushed, anchored) from the options
** at idx (a table or nil). The uv handle is not initialised yet.
*/
static mc_chan *chan_new(lua_State *L, int opts) {
    lua_Integer max = CHAN_DEFAULT_MAX_FRAME;
    int on_close = LUA_NOREF;
    chan_box *box;
    mc_chan *ch;
    if (!lua_isnoneornil(L, opts)) {
        if (lua_type(L, opts) != LUA_TTABLE) mc_raise(L, "INVALID_INPUT", "options must be a table");
        mc_check_keys(L, opts, chan_keys);
        max = mc_opt_int(L, opts, "max_frame_bytes", CHAN_DEFAULT_MAX_FRAME, 4, (lua_Integer)WIRE_MAX_FRAME);
        lua_getfield(L, opts, "on_close");
        if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TFUNCTION)
            mc_raise(L, "INVALID_INPUT", "option 'on_close' must be a function");
        lua_pop(L, 1);
    }
    box = (chan_box *)mc_handle_new(L, &chan_class);
    ch = (mc_chan *)calloc(1, sizeof *ch);
    if (ch == NULL) mc_raise_oom(L);
    ch->L = mc_main(L);
    ch->max_frame = (size_t)max;
    ch->next_id = 1;
    ch->on_close_ref = ch->connect_cb_ref = ch->pending_ref = ch->self_ref = LUA_NOREF;
    ch->life.holds++;   /* the userdata's */
    box->ch = ch;   /* owned by the box from here: a raise below is cleaned up by __gc */
    if (!lua_isnoneornil(L, opts)) on_close = mc_opt_func_ref(L, opts, "on_close");
    ch->on_close_ref = on_close;
    lua_newtable(L);
    ch->pending_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    ch->more_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, -1);
    ch->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return ch;
}

/* core.channel(fd, opts) -> channel. Takes the descriptor: the channel closes it. */
static int l_channel(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    lua_Integer fd = -1;
    mc_chan *ch;
    int rc;
    if (lua_isinteger(L, 1)) fd = lua_tointeger(L, 1);
    if (fd < 0 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)
        return mc_raise(L, "INVALID_INPUT", "channel expects an open descriptor");
    ch = chan_new(L, 2);
    uv_pipe_init(loop, &ch->pipe, 0);
    ch->pipe.data = ch;
    ch->life.uv = 1;
    rc = uv_pipe_open(&ch->pipe, (uv_file)fd);
    if (rc == 0) rc = uv_read_start((uv_stream_t *)&ch->pipe, chan_alloc, chan_on_read);
    if (rc != 0) {
        close((int)fd);   /* owned from here on, even when it cannot be used */
        chan_shutdown(ch, L, "unavailable", "", 0);
        lua_pushnil(L);
        mc_push_error(L, "SANDBOX_ERROR", "cannot use descriptor %d: %s", (int)fd, uv_strerror(rc));
        mc_error_field(L, "reason", "unavailable");
        return 2;
    }
    return 1;
}

static void chan_on_connect(uv_connect_t *req, int status) {
    mc_chan *ch = (mc_chan *)req->data;
    lua_State *L = ch->L;
    int cb = ch->connect_cb_ref, self = ch->self_ref;
    ch->connect_cb_ref = LUA_NOREF;
    if (L == NULL || ch->closed) return;   /* the state closed meanwhile: the handle is closing */
    if (status == 0) status = uv_read_start((uv_stream_t *)&ch->pipe, chan_alloc, chan_on_read);
    ch->life.holds++;
    lua_rawgeti(L, LUA_REGISTRYINDEX, cb);
    luaL_unref(L, LUA_REGISTRYINDEX, cb);
    if (status == 0) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, self);
        mc_call(L, 1);
    } else {
        chan_shutdown(ch, L, "unavailable", "", 0);
        lua_pushnil(L);
        mc_push_error(L, "SANDBOX_ERROR", "cannot connect to the agent: %s", uv_strerror(status));
        mc_error_field(L, "reason", "unavailable");
        mc_call(L, 2);
    }
    ch->life.holds--;
    chan_maybe_free(ch);
}

/* core.channel_connect(path, opts, cb): cb(channel) or cb(nil, err) with reason 'unavailable'. */
static int l_channel_connect(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    const char *path = mc_check_path(L, 1, "path");
    struct sockaddr_un sa;
    mc_chan *ch;
    /* libuv of this age cuts a long path silently: refuse it instead */
    if (strlen(path) >= sizeof sa.sun_path)
        return mc_raise(L, "INVALID_INPUT", "a socket path is at most %d bytes", (int)sizeof sa.sun_path - 1);
    if (lua_type(L, 3) != LUA_TFUNCTION) return mc_raise(L, "INVALID_INPUT", "channel_connect expects a callback");
    ch = chan_new(L, 2);
    lua_pushvalue(L, 3);
    ch->connect_cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    uv_pipe_init(loop, &ch->pipe, 0);
    ch->pipe.data = ch;
    ch->life.uv = 1;
    ch->connect_req.data = ch;
    uv_pipe_connect(&ch->connect_req, &ch->pipe, path, chan_on_connect);
    return 0;
}

static const luaL_Reg chan_methods[] = {
    {"call", l_chan_call},
    {"close", l_chan_close},
    {"pending", l_chan_pending},
    {"is_closed", l_chan_is_closed},
    {NULL, NULL}
};

static const mc_class chan_class = { CHAN_MT, sizeof(chan_box), l_chan_gc, l_chan_tostring, chan_methods, NULL };

static void mc_open_chan(lua_State *L) {
    mc_class_register(L, &chan_class);
    lua_pushcfunction(L, l_channel);
    lua_setfield(L, -2, "channel");
    lua_pushcfunction(L, l_channel_connect);
    lua_setfield(L, -2, "channel_connect");
}

/* }====================================================== */
