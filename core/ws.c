/*
** ws.c: core.ws_connect, a WebSocket client on the libuv loop the core
** shares with luv, through libwebsockets (its libuv event library, given our
** loop as a foreign loop). libwebsockets does the handshake, the framing,
** masking, fragmentation, ping/pong and the close handshake; this file only
** moves whole messages between it and Lua.
**
**   local conn = core.ws_connect({ url = 'wss://host/path', headers = { Authorization = 'Bearer x' },
**     protocols = 'a, b', max_message_bytes = 16777216 }, function(kind, a, b) ... end)
**   conn:send(bytes, binary)     -- queued; sent when the socket can take it
** `ca_file` (a PEM file of the authorities to trust instead of the system's) or `ca_pem` (that PEM
** text itself), and `client_cert`
** with `client_key` (PEM files: TLS client authentication) apply to a wss:// URL: each set of them
** gets a vhost of its own (its client TLS context), kept with the context, MC_WS_MAX_VHOSTS at most.
**   conn:close(code)             -- the close handshake (1000 by default), then 'close'
**
** on_event(kind, ...) runs on the main thread from the loop:
**   'open', protocol           the handshake is done (the protocol the server chose, or nil)
**   'message', bytes, binary   one whole message (fragments joined)
**   'close', code, err_code, status
**                              the end, exactly once: the close code the server sent (or nil),
**                              and for a failure an error code (CONNECT_FAILED, the handshake
**                              refused with HTTP `status` when there was an answer;
**                              LIMIT_EXCEEDED, a message above max_message_bytes; NETWORK_ERROR)
** An error raised by on_event is reported (core.report) and closes the connection.
**
** One lws context per Lua state, made on first use and kept until the state
** closes (destroying and remaking contexts on one loop while the old one's
** handles close aborts libuv). The handles the context makes for itself are
** unreferenced, so an idle context does not keep the loop running; a live
** connection does, through its socket's handle. A connection's C side is heap memory owned by
** libwebsockets' connection; the Lua handle only points at it and is anchored
** in the registry until 'close' is delivered.
*/
#include "mc.h"
#include <ctype.h>
#include <libwebsockets.h>

#define MC_WS_MT "mayura.ws"
#define MC_WS_STATE_MT "mayura.ws_state"
#define MC_WS_STATE_KEY "mayura.core.ws_state"
#define MC_WS_DEFAULT_MAX ((size_t)16 * 1024 * 1024)
#define MC_WS_MAX_VHOSTS 8
#define MC_WS_PROTO_NAME "mayura-ws"

typedef struct mc_ws_state mc_ws_state;
typedef struct mc_ws_conn mc_ws_conn;

typedef struct mc_ws_msg {
    struct mc_ws_msg *next;
    size_t len;
    int binary;
    unsigned char data[]; /* LWS_PRE bytes of room, then the message */
} mc_ws_msg;

struct mc_ws_state {
    struct lws_context *ctx;
    uv_handle_t **own;      /* the handles the context made on the loop (its idle and timer) */
    size_t nown;
    uv_loop_t *loop;
    lua_State *L;
    mc_ws_conn *connecting; /* inside lws_client_connect_via_info for it */
    int conns;
    int closed;
    struct {
        char *key;            /* "ca\ncert\nkey" */
        struct lws_vhost *vh; /* destroyed with the context */
    } vhosts[MC_WS_MAX_VHOSTS];
    int nvhosts;
};

struct mc_ws_conn {
    mc_ws_state *st;
    struct lws *wsi;
    int cb_ref, self_ref;
    char *headers;           /* "name\0value\0" pairs, ending with an empty name */
    mc_ws_msg *q_head, *q_tail;
    unsigned char *in;       /* the message being received */
    size_t in_len, in_cap, max;
    int closing, close_code, peer_code, peer_closed, done, opened, destroyed;
    const char *fail;        /* an error code for the 'close' event */
    int status;              /* the HTTP status of a refused handshake */
    char protocol[128];      /* the protocol the server chose */
};

/* The Lua handle: a pointer to the connection, NULL once it ended. */
typedef struct mc_ws_handle {
    mc_ws_conn *c;
} mc_ws_handle;

static const mc_class mc_ws_class, mc_ws_state_class;   /* at the end of the file */

static void mc_ws_unref(lua_State *L, int *ref) {
    if (*ref != LUA_NOREF && *ref != LUA_REFNIL) luaL_unref(L, LUA_REGISTRYINDEX, *ref);
    *ref = LUA_NOREF;
}


/* Calls on_event(kind, ...) with nargs arguments above the kind already pushed; 0, or -1 on error. */
static int mc_ws_emit(mc_ws_conn *c, const char *kind, int nargs) {
    lua_State *L = c->st->L;
    int i;
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->cb_ref);
    lua_pushstring(L, kind);
    for (i = 0; i < nargs; i++) {
        lua_pushvalue(L, -2 - nargs);
    }
    /* stack: args..., fn, kind, args... -> drop the originals below */
    if (mc_call(L, nargs + 1) != 0) {
        lua_pop(L, nargs);
        return -1;
    }
    lua_pop(L, nargs);
    return 0;
}

/* The end of a connection: the 'close' event, then nothing of it is left for Lua. */
static void mc_ws_finish(mc_ws_conn *c) {
    lua_State *L = c->st->L;
    mc_ws_msg *m;
    if (c->done) return;
    c->done = 1;
    if (c->peer_code > 0) lua_pushinteger(L, c->peer_code);
    else lua_pushnil(L);
    if (c->fail != NULL) lua_pushstring(L, c->fail);
    else lua_pushnil(L);
    if (c->status > 0) lua_pushinteger(L, c->status);
    else lua_pushnil(L);
    mc_ws_emit(c, "close", 3);
    while ((m = c->q_head) != NULL) {
        c->q_head = m->next;
        free(m);
    }
    c->q_tail = NULL;
    free(c->in);
    c->in = NULL;
    free(c->headers);
    c->headers = NULL;
    /* the handle no longer points here */
    if (c->self_ref != LUA_NOREF) {
        mc_ws_handle *h;
        lua_rawgeti(L, LUA_REGISTRYINDEX, c->self_ref);
        h = (mc_ws_handle *)lua_touserdata(L, -1);
        if (h != NULL) h->c = NULL;
        lua_pop(L, 1);
    }
    mc_ws_unref(L, &c->cb_ref);
    mc_ws_unref(L, &c->self_ref);
}

/*
** The one callback libwebsockets calls for everything on a connection. Long because it is one
** switch over the library's reasons, each case a few lines that belong to that reason (headers
** to add, a message part, a write turn, the three ways a connection ends); split apart they
** would only be read side by side again.
*/
static int mc_ws_on_event(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    mc_ws_conn *c = wsi != NULL ? (mc_ws_conn *)lws_get_opaque_user_data(wsi) : NULL;
    if (c == NULL) return lws_callback_http_dummy(wsi, reason, user, in, len);
    switch (reason) {
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        unsigned char **p = (unsigned char **)in, *end = (*p) + len;
        const char *h = c->headers;
        char name[256];
        while (h != NULL && *h != '\0') {
            const char *v = h + strlen(h) + 1;
            int n = snprintf(name, sizeof name, "%s:", h);
            if (n <= 0 || (size_t)n >= sizeof name) return -1;
            if (lws_add_http_header_by_name(wsi, (const unsigned char *)name, (const unsigned char *)v,
                                            (int)strlen(v), p, end))
                return -1;
            h = v + strlen(v) + 1;
        }
        break;
    }
    case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
        /* the answer's headers are still there: keep the protocol the server chose */
        if (lws_hdr_copy(wsi, c->protocol, (int)sizeof c->protocol, WSI_TOKEN_PROTOCOL) <= 0) c->protocol[0] = '\0';
        break;
    case LWS_CALLBACK_CLIENT_ESTABLISHED: {
        c->opened = 1;
        if (c->protocol[0] != '\0') lua_pushstring(c->st->L, c->protocol);
        else lua_pushnil(c->st->L);
        if (mc_ws_emit(c, "open", 1) != 0) {
            c->fail = "NETWORK_ERROR";
            c->closing = 1;
            c->close_code = LWS_CLOSE_STATUS_GOINGAWAY;
        }
        if (c->q_head != NULL || c->closing) lws_callback_on_writable(wsi);
        break;
    }
    case LWS_CALLBACK_CLIENT_RECEIVE: {
        int binary = lws_frame_is_binary(wsi);
        if (c->closing) break;
        /* never -1 from here: libwebsockets 4.1 goes on parsing the frame into a buffer it gave
        ** back; the rest of the message is dropped and the close is sent when writable */
        if (len > c->max || c->in_len > c->max - len) {
            c->fail = "LIMIT_EXCEEDED";
            c->closing = 1;
            c->close_code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
            lws_callback_on_writable(wsi);
            break;
        }
        if (c->in_len + len > c->in_cap) {
            size_t cap = c->in_cap ? c->in_cap : 4096;
            unsigned char *p;
            while (cap < c->in_len + len) cap *= 2;
            if (cap > c->max) cap = c->max;
            p = (unsigned char *)realloc(c->in, cap ? cap : 1);
            if (p == NULL) {
                c->fail = "NO_MEMORY";
                c->closing = 1;
                c->close_code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
                lws_callback_on_writable(wsi);
                break;
            }
            c->in = p;
            c->in_cap = cap;
        }
        if (len > 0) memcpy(c->in + c->in_len, in, len);
        c->in_len += len;
        if (lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0) {
            lua_State *L = c->st->L;
            lua_pushlstring(L, c->in != NULL ? (const char *)c->in : "", c->in_len);
            lua_pushboolean(L, binary);
            c->in_len = 0;
            if (c->in_cap > 256 * 1024) {
                free(c->in);
                c->in = NULL;
                c->in_cap = 0;
            }
            if (mc_ws_emit(c, "message", 2) != 0) {
                c->fail = "NETWORK_ERROR";
                c->closing = 1;
                c->close_code = LWS_CLOSE_STATUS_GOINGAWAY;
                lws_callback_on_writable(wsi);
            }
        }
        break;
    }
    case LWS_CALLBACK_CLIENT_WRITEABLE: {
        mc_ws_msg *m = c->q_head;
        if (m != NULL && !c->closing) {
            int n;
            c->q_head = m->next;
            if (c->q_head == NULL) c->q_tail = NULL;
            n = lws_write(wsi, m->data + LWS_PRE, m->len, m->binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT);
            free(m);
            if (n < 0) {
                c->fail = "NETWORK_ERROR";
                return -1;
            }
            if (c->q_head != NULL) lws_callback_on_writable(wsi);
            break;
        }
        if (c->closing) {
            lws_close_reason(wsi, (enum lws_close_status)c->close_code, NULL, 0);
            return -1;
        }
        break;
    }
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        c->peer_closed = 1;
        if (len >= 2) {
            const unsigned char *p = (const unsigned char *)in;
            c->peer_code = (p[0] << 8) | p[1];
        }
        break;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
        unsigned int status = lws_http_client_http_response(wsi);
        c->fail = "CONNECT_FAILED";
        if (status > 0 && status != 101) c->status = (int)status;
        mc_ws_finish(c);
        break;
    }
    case LWS_CALLBACK_CLIENT_CLOSED:
        if (!c->opened && c->fail == NULL) c->fail = "CONNECT_FAILED";
        /* neither side began the close handshake: the connection was dropped */
        if (c->opened && !c->peer_closed && !c->closing && c->fail == NULL) c->fail = "NETWORK_ERROR";
        mc_ws_finish(c);
        break;
    case LWS_CALLBACK_WSI_DESTROY:
        if (!c->done) {
            if (c->fail == NULL) c->fail = c->opened ? "NETWORK_ERROR" : "CONNECT_FAILED";
            mc_ws_finish(c);
        }
        lws_set_opaque_user_data(wsi, NULL);
        c->wsi = NULL;
        c->st->conns--;
        if (c->st->connecting == c) c->destroyed = 1; /* l_ws_connect frees it */
        else free(c);
        break;
    default:
        break;
    }
    return 0;
}

static const struct lws_protocols mc_ws_protocols[] = {
    {MC_WS_PROTO_NAME, mc_ws_on_event, 0, 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0}
};

/* The handles on the loop, to tell the ones a new context makes from the others. */
typedef struct mc_ws_walk {
    uv_handle_t **seen;
    size_t n, cap;
    int failed;
    mc_ws_state *st;
    size_t room;
} mc_ws_walk;

static void mc_ws_collect(uv_handle_t *h, void *arg) {
    mc_ws_walk *w = (mc_ws_walk *)arg;
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        uv_handle_t **p = (uv_handle_t **)realloc(w->seen, cap * sizeof *p);
        if (p == NULL) {
            w->failed = 1;
            return;
        }
        w->seen = p;
        w->cap = cap;
    }
    w->seen[w->n++] = h;
}

/* A handle the new context made: unreferenced (an idle context keeps nothing alive) and kept in
** the state's list (st->own, room made beforehand for every handle the loop may then hold). */
static void mc_ws_unref_new(uv_handle_t *h, void *arg) {
    mc_ws_walk *w = (mc_ws_walk *)arg;
    size_t i;
    for (i = 0; i < w->n; i++)
        if (w->seen[i] == h) return;
    uv_unref(h);
    if (w->st != NULL && w->st->nown < w->room) w->st->own[w->st->nown++] = h;
}

/* Counts the context's own handles still on the loop (a walk callback). */
typedef struct mc_ws_left {
    mc_ws_state *st;
    size_t n;
} mc_ws_left;

static void mc_ws_count_own(uv_handle_t *h, void *arg) {
    mc_ws_left *l = (mc_ws_left *)arg;
    size_t i;
    for (i = 0; i < l->st->nown; i++)
        if (l->st->own[i] == h) l->n++;
}

static int l_ws_state_gc(lua_State *L) {
    mc_ws_state *st = (mc_ws_state *)lua_touserdata(L, 1);
    int i;
    if (st == NULL || st->closed) return 0;
    st->closed = 1;
    if (st->ctx != NULL) {
        struct lws_context *ctx = st->ctx;
        st->ctx = NULL;
        lws_context_destroy(ctx);
        /*
        ** On a loop it did not make, libwebsockets 4.1 ends a context in steps: its sockets'
        ** handles close first, and only their close callbacks close its idle and timer
        ** handles. Left for later, luv's loop finalizer (when the state closes) would close
        ** those as if they were luv's and crash: the loop runs here, without waiting, until
        ** none of the context's handles is left (a few turns; bounded all the same).
        */
        for (i = 0; i < 64; i++) {
            mc_ws_left left;
            left.st = st;
            left.n = 0;
            uv_walk(st->loop, mc_ws_count_own, &left);
            if (left.n == 0) break;
            uv_run(st->loop, UV_RUN_NOWAIT);
        }
    }
    free(st->own);
    st->own = NULL;
    st->nown = 0;
    for (i = 0; i < st->nvhosts; i++) free(st->vhosts[i].key);
    st->nvhosts = 0;
    return 0;
}

/* The state's WebSocket state, with a live context. */
static mc_ws_state *mc_ws_get_state(lua_State *L) {
    mc_ws_state *st;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_WS_STATE_KEY);
    st = (mc_ws_state *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (st == NULL) {
        st = (mc_ws_state *)mc_handle_new(L, &mc_ws_state_class);
        st->loop = mc_loop(L);
        st->L = mc_main(L);
        lua_setfield(L, LUA_REGISTRYINDEX, MC_WS_STATE_KEY);
    }
    if (st->closed) mc_raise(L, "INVALID_INPUT", "WebSockets are shut down");
    if (st->ctx == NULL) {
        struct lws_context_creation_info info;
        void *foreign[1];
        foreign[0] = st->loop;
        memset(&info, 0, sizeof info);
        info.port = CONTEXT_PORT_NO_LISTEN;
        info.protocols = mc_ws_protocols;
        info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
        info.foreign_loops = foreign;
        info.gid = -1;
        info.uid = -1;
        mc_ws_walk w;
        memset(&w, 0, sizeof w);
        uv_walk(st->loop, mc_ws_collect, &w);
        if (w.failed) {
            free(w.seen);
            mc_raise_oom(L);
        }
        free(st->own);
        st->nown = 0;
        st->own = (uv_handle_t **)calloc(64, sizeof *st->own);
        if (st->own == NULL) {
            free(w.seen);
            mc_raise_oom(L);
        }
        w.st = st;
        w.room = 64;
        lws_set_log_level(0, NULL);
        st->ctx = lws_create_context(&info);
        if (st->ctx != NULL) uv_walk(st->loop, mc_ws_unref_new, &w);
        free(w.seen);
        if (st->ctx == NULL) mc_raise(L, "NETWORK_ERROR", "libwebsockets cannot make a context");
    }
    return st;
}

static const char *const mc_ws_keys[] = {"url", "headers", "protocols", "max_message_bytes", "ca_file",
                                         "ca_pem", "client_cert", "client_key", NULL};

/* A file option: NULL when nil, else a string without NUL shorter than PATH_MAX. */
static const char *mc_ws_path_opt(lua_State *L, const char *name) {
    size_t n;
    const char *v = mc_opt_lstr(L, 1, name, &n);
    if (v != NULL && (n == 0 || n >= PATH_MAX || strlen(v) != n))
        mc_raise(L, "INVALID_INPUT", "%s must be a path", name);
    return v;
}

/* The vhost whose client TLS trusts `ca` (or the PEM text `pem`) and presents `cert` and `key` (any
** may be NULL): made once per set (its own client TLS context) and kept; NULL when it cannot be
** made (files unreadable, a PEM that does not parse). */
static struct lws_vhost *mc_ws_vhost(lua_State *L, mc_ws_state *st, const char *ca, const char *cert,
                                     const char *key, const char *pem, size_t pem_len) {
    struct lws_context_creation_info info;
    struct lws_vhost *vh;
    char name[32], *k;
    size_t n = strlen(ca ? ca : "") + strlen(cert ? cert : "") + strlen(key ? key : "") + pem_len + 4;
    int i;
    mc_ws_walk w;
    k = (char *)malloc(n);
    if (k == NULL) mc_raise_oom(L);
    snprintf(k, n, "%s\n%s\n%s\n%s", ca ? ca : "", cert ? cert : "", key ? key : "", pem ? pem : "");
    for (i = 0; i < st->nvhosts; i++)
        if (strcmp(st->vhosts[i].key, k) == 0) {
            free(k);
            return st->vhosts[i].vh;
        }
    if (st->nvhosts == MC_WS_MAX_VHOSTS) {
        free(k);
        mc_raise(L, "LIMIT_EXCEEDED", "at most %d sets of TLS files for WebSockets", MC_WS_MAX_VHOSTS);
    }
    memset(&info, 0, sizeof info);
    snprintf(name, sizeof name, "mayura-tls-%d", st->nvhosts);
    info.vhost_name = name;
    info.port = CONTEXT_PORT_NO_LISTEN;
    info.protocols = mc_ws_protocols;
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    info.client_ssl_ca_filepath = ca;
    if (pem != NULL) {
        info.client_ssl_ca_mem = pem;
        info.client_ssl_ca_mem_len = (unsigned int)pem_len;
    }
    info.client_ssl_cert_filepath = cert;
    info.client_ssl_private_key_filepath = key;
    /* as for the context: what handles it makes on the loop are not ours to keep it alive */
    memset(&w, 0, sizeof w);
    uv_walk(st->loop, mc_ws_collect, &w);
    if (w.failed) {
        free(w.seen);
        free(k);
        mc_raise_oom(L);
    }
    w.st = st;
    w.room = 64;
    vh = lws_create_vhost(st->ctx, &info);
    if (vh != NULL) uv_walk(st->loop, mc_ws_unref_new, &w);
    free(w.seen);
    if (vh == NULL) {
        free(k);
        return NULL;
    }
    st->vhosts[st->nvhosts].key = k;
    st->vhosts[st->nvhosts].vh = vh;
    st->nvhosts++;
    return vh;
}

/* A header name: a token; a value: no control characters. */
static int mc_ws_header_ok(const char *s, size_t n, int name) {
    size_t i;
    if (name && n == 0) return 0;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (name && !(isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch) != NULL)) return 0;
        if (!name && (ch < 0x20 || ch == 0x7f)) return 0;
    }
    return 1;
}

/*
** core.ws_connect(opts, on_event) -> handle. Long because every option is checked before
** anything is made (the URL, the headers, the protocols, the size cap), then the connection's
** record and its handle are made and anchored before libwebsockets may call back, which it can
** do before lws_client_connect_via_info returns.
*/
static int l_ws_connect(lua_State *L) {
    struct lws_client_connect_info ci;
    mc_ws_state *st;
    mc_ws_conn *c;
    mc_ws_handle *h;
    size_t ulen, plen = 0, hlen = 1, pem_len = 0;
    const char *url, *protocols, *scheme, *host, *path, *ca, *cert, *key, *pem;
    struct lws_vhost *vh = NULL;
    char *ubuf, *pathbuf;
    int port, tls;
    lua_Integer max;
    if (!lua_istable(L, 1)) return mc_raise(L, "INVALID_INPUT", "ws_connect expects an options table");
    if (lua_type(L, 2) != LUA_TFUNCTION) return mc_raise(L, "INVALID_INPUT", "ws_connect expects a callback");
    mc_check_keys(L, 1, mc_ws_keys);
    url = mc_opt_lstr(L, 1, "url", &ulen);
    if (url == NULL || ulen > 4096 || strlen(url) != ulen) return mc_raise(L, "INVALID_INPUT", "url must be a ws:// or wss:// URL");
    protocols = mc_opt_lstr(L, 1, "protocols", &plen);
    if (protocols != NULL && (strlen(protocols) != plen || !mc_ws_header_ok(protocols, plen, 0)))
        return mc_raise(L, "INVALID_INPUT", "protocols must be a header value");
    max = mc_opt_int(L, 1, "max_message_bytes", (lua_Integer)MC_WS_DEFAULT_MAX, 1, (lua_Integer)1 << 30);
    ca = mc_ws_path_opt(L, "ca_file");
    cert = mc_ws_path_opt(L, "client_cert");
    key = mc_ws_path_opt(L, "client_key");
    pem = mc_opt_lstr(L, 1, "ca_pem", &pem_len);
    if (pem != NULL && (pem_len == 0 || pem_len > ((size_t)1 << 20) || strlen(pem) != pem_len || ca != NULL))
        return mc_raise(L, "INVALID_INPUT", "ca_pem must be PEM text (and not with ca_file)");
    if ((cert == NULL) != (key == NULL)) return mc_raise(L, "INVALID_INPUT", "client_cert and client_key go together");
    /* headers, checked before anything is made */
    lua_getfield(L, 1, "headers");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1)) return mc_raise(L, "INVALID_INPUT", "headers must be a table");
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            size_t kn, vn;
            const char *k, *v;
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
                return mc_raise(L, "INVALID_INPUT", "headers must map names to strings");
            k = lua_tolstring(L, -2, &kn);
            v = lua_tolstring(L, -1, &vn);
            if (kn > 200 || strlen(k) != kn || strlen(v) != vn || !mc_ws_header_ok(k, kn, 1) ||
                !mc_ws_header_ok(v, vn, 0))
                return mc_raise(L, "INVALID_INPUT", "a header name or value is not valid");
            hlen += kn + vn + 2;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    ubuf = (char *)lua_newuserdatauv(L, ulen + 1, 0); /* lws_parse_uri writes into it */
    memcpy(ubuf, url, ulen + 1);
    if (lws_parse_uri(ubuf, &scheme, &host, &port, &path) != 0 || host[0] == '\0')
        return mc_raise(L, "INVALID_INPUT", "url must be a ws:// or wss:// URL");
    if (strcmp(scheme, "ws") == 0) tls = 0;
    else if (strcmp(scheme, "wss") == 0) tls = 1;
    else return mc_raise(L, "INVALID_INPUT", "url must be a ws:// or wss:// URL");
    if (tls && port == 80) port = 443; /* lws_parse_uri's default is http's */
    pathbuf = (char *)lua_newuserdatauv(L, strlen(path) + 2, 0);
    pathbuf[0] = '/';
    strcpy(pathbuf + 1, path);

    st = mc_ws_get_state(L);
    if (tls && (ca != NULL || cert != NULL || pem != NULL)) {
        vh = mc_ws_vhost(L, st, ca, cert, key, pem, pem_len);
        if (vh == NULL) return mc_raise(L, "INVALID_INPUT", "the TLS files (ca_file, client_cert, client_key) cannot be used");
    }
    h = (mc_ws_handle *)mc_handle_new(L, &mc_ws_class);   /* made first, empty */
    c = (mc_ws_conn *)calloc(1, sizeof *c);
    if (c == NULL) return mc_raise_oom(L);
    c->headers = (char *)malloc(hlen);
    if (c->headers == NULL) {
        free(c);
        return mc_raise_oom(L);
    }
    {
        char *p = c->headers;
        lua_getfield(L, 1, "headers");
        if (!lua_isnil(L, -1)) {
            lua_pushnil(L);
            while (lua_next(L, -2) != 0) {
                size_t kn, vn;
                const char *k = lua_tolstring(L, -2, &kn), *v = lua_tolstring(L, -1, &vn);
                memcpy(p, k, kn + 1);
                p += kn + 1;
                memcpy(p, v, vn + 1);
                p += vn + 1;
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
        *p = '\0';
    }
    c->st = st;
    c->max = (size_t)max;
    c->cb_ref = LUA_NOREF;
    c->self_ref = LUA_NOREF;
    c->close_code = LWS_CLOSE_STATUS_NORMAL;
    memset(&ci, 0, sizeof ci);
    ci.context = st->ctx;
    ci.address = host;
    ci.port = port;
    ci.ssl_connection = tls ? LCCSCF_USE_SSL : 0;
    ci.vhost = vh;   /* NULL: the context's default one (the system's authorities) */
    ci.path = pathbuf;
    ci.host = host;
    ci.origin = host;
    ci.protocol = protocols;
    ci.local_protocol_name = MC_WS_PROTO_NAME;
    ci.opaque_user_data = c;
    ci.pwsi = &c->wsi;
    /* anchored first: libwebsockets may call back (even 'close') before it returns */
    lua_pushvalue(L, 2);
    c->cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, -1);
    c->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    h->c = c;
    st->conns++;
    st->connecting = c;
    if (lws_client_connect_via_info(&ci) == NULL && !c->destroyed) {
        /* refused before a connection existed: nothing of libwebsockets holds c */
        c->fail = "CONNECT_FAILED";
        mc_ws_finish(c);
        st->conns--;
        c->destroyed = 1;
    }
    st->connecting = NULL;
    if (c->destroyed) free(c);
    return 1;
}

static mc_ws_handle *mc_ws_check(lua_State *L) {
    return (mc_ws_handle *)luaL_checkudata(L, 1, MC_WS_MT);
}

static int l_ws_send(lua_State *L) {
    mc_ws_handle *h = mc_ws_check(L);
    size_t n;
    const char *data;
    if (lua_type(L, 2) != LUA_TSTRING) return mc_raise(L, "INVALID_INPUT", "send expects a string");
    data = lua_tolstring(L, 2, &n);
    int binary = lua_toboolean(L, 3);
    mc_ws_conn *c = h->c;
    mc_ws_msg *m;
    if (c == NULL || c->done || c->closing || c->wsi == NULL)
        return mc_raise(L, "NETWORK_ERROR", "the WebSocket is closed");
    m = (mc_ws_msg *)malloc(sizeof *m + LWS_PRE + n);
    if (m == NULL) return mc_raise_oom(L);
    m->next = NULL;
    m->len = n;
    m->binary = binary;
    memcpy(m->data + LWS_PRE, data, n);
    if (c->q_tail != NULL) c->q_tail->next = m;
    else c->q_head = m;
    c->q_tail = m;
    if (c->opened) lws_callback_on_writable(c->wsi);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_ws_close(lua_State *L) {
    mc_ws_handle *h = mc_ws_check(L);
    lua_Integer code = luaL_optinteger(L, 2, LWS_CLOSE_STATUS_NORMAL);
    mc_ws_conn *c = h->c;
    if (code < 1000 || code > 4999) return mc_raise(L, "INVALID_INPUT", "a close code is 1000 to 4999");
    if (c == NULL || c->done || c->closing || c->wsi == NULL) return 0;
    c->closing = 1;
    c->close_code = (int)code;
    if (c->opened) lws_callback_on_writable(c->wsi);
    else lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC); /* never from its own callback */
    return 0;
}

/*
** __gc and __close: closes an open connection (code 1000), as ws:close() does; nothing when it
** ended or is closing. An open connection is anchored, so __gc runs for one only while the state
** closes (and none once the WebSocket state is shut down).
*/
static int l_ws_gc(lua_State *L) {
    mc_ws_handle *h = mc_ws_check(L);
    mc_ws_conn *c = h->c;
    if (c == NULL || c->done || c->closing || c->wsi == NULL || c->st == NULL || c->st->closed) return 0;
    c->closing = 1;
    c->close_code = LWS_CLOSE_STATUS_NORMAL;
    if (c->opened) lws_callback_on_writable(c->wsi);
    else lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
    return 0;
}

static int l_ws_tostring(lua_State *L) {
    mc_ws_handle *h = mc_ws_check(L);
    lua_pushfstring(L, "mayura.ws (%s): %p", h->c == NULL ? "closed" : "open", (void *)h);
    return 1;
}

static const luaL_Reg mc_ws_methods[] = {
    {"send", l_ws_send},
    {"close", l_ws_close},
    {NULL, NULL}
};

static const mc_class mc_ws_class = { MC_WS_MT, sizeof(mc_ws_handle), l_ws_gc, l_ws_tostring, mc_ws_methods, NULL };
static const mc_class mc_ws_state_class = { MC_WS_STATE_MT, sizeof(mc_ws_state), l_ws_state_gc, NULL, NULL, NULL };

static void mc_open_ws(lua_State *L) {
    mc_class_register(L, &mc_ws_class);
    mc_class_register(L, &mc_ws_state_class);
    lua_pushcfunction(L, l_ws_connect);
    lua_setfield(L, -2, "ws_connect");
}
