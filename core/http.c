/*
** http.c: core.http.request, an HTTP client on libcurl's multi socket
** interface driven by the libuv loop the core shares with luv.
**
** curl says which sockets to watch (one uv_poll_t each) and when to wake it
** (one uv_timer_t); readiness goes back through curl_multi_socket_action.
** No threads of ours and never the blocking easy API. One CURLM per Lua
** state, made on first use and kept in the registry.
**
** A request with `aws_sigv4` ('aws:amz:<region>:<service>'), `aws_key_id` and
** `aws_secret` (only all three together) is signed by libcurl with AWS
** Signature V4 (CURLOPT_AWS_SIGV4, the key pair as CURLOPT_USERNAME and
** CURLOPT_PASSWORD, which libcurl copies): never sent as Basic credentials.
**
** `http_version` picks the protocol: '1.1', or '2', HTTP/2 only: with prior knowledge (h2c) to
** an http:// URL, by ALPN over TLS to an https:// one; an answer in HTTP/1.x then fails the
** transfer (NETWORK_ERROR). Without it libcurl's default holds: HTTP/1.1 in the clear, HTTP/2
** when TLS agrees. Trailers (HTTP/2's, or a chunked HTTP/1.1 body's) come in the result's
** `trailers`, named as headers are; gRPC puts its status there. `ca_file` names a PEM file of the
** authorities to trust in place of the system's (a server with a test authority), `ca_pem` gives
** them as PEM text instead; `client_cert`
** and `client_key` name PEM files of a client certificate and its key (TLS client authentication).
**
** Lua never runs inside a curl callback: those only fill C buffers and put
** the request on a queue of "news". The queue is delivered to Lua
** (on_headers, on_data, then the final callback) after
** curl_multi_socket_action has returned, so a Lua callback may cancel any
** transfer or start new ones without re-entering curl.
*/
#include "mc.h"
#include <sys/un.h>
#include <strings.h>
#include <curl/curl.h>

#define MC_HTTP_MT "mayura.http_request"
#define MC_HTTP_MULTI_MT "mayura.http_multi"
#define MC_HTTP_MULTI_KEY "mayura.core.http_multi"
#define MC_HTTP_DEFAULT_MAX_BODY ((lua_Integer)64 * 1024 * 1024)
/* A response head larger than this is refused rather than buffered. */
#define MC_HTTP_MAX_HEAD ((size_t)1024 * 1024)
/* A streaming buffer that grew past this is given back after delivery. */
#define MC_HTTP_KEEP_PEND ((size_t)256 * 1024)

static const char MC_HTTP_CANCELLED[] = "CANCELLED";

typedef struct mc_http_multi mc_http_multi;
typedef struct mc_http_req mc_http_req;
static const mc_class mc_http_class, mc_http_multi_class;   /* at the end of the file */
typedef struct mc_http_sock mc_http_sock;

typedef mc_buf mc_http_buf;

/* One watched socket. Heap memory: it must outlive uv_close's callback. */
struct mc_http_sock {
    uv_poll_t poll;            /* first: the close callback casts back */
    curl_socket_t fd;
    int events;
    int closed;                /* uv_close called: never touch poll again */
    mc_http_multi *m;          /* NULL once detached from the multi */
    mc_http_sock *prev, *next; /* the multi's live sockets */
};

/* One per Lua state, a userdata in the registry. */
struct mc_http_multi {
    CURLM *multi;
    uv_loop_t *loop;
    lua_State *L;                 /* main thread: Lua callbacks run there */
    uv_timer_t *timer;            /* curl's timeout */
    uv_idle_t *kick;              /* delivers news that arose outside a curl action */
    mc_http_req *active;          /* requests whose easy handle is in the multi */
    mc_http_req *q_head, *q_tail; /* requests with news for Lua */
    mc_http_sock *socks;
    int in_action;                /* inside curl_multi_socket_action */
    int delivering;               /* inside the delivery loop */
    int closed;                   /* finalised */
    int loop_gone;                /* our handles were closed by someone else (state closing) */
};

enum { MC_HTTP_ACTIVE, MC_HTTP_DONE, MC_HTTP_DELIVERED };

struct mc_http_req {
    mc_http_multi *m;          /* NULL once the multi is finalised */
    CURL *easy;
    struct curl_slist *hlist;
    int state;
    int in_multi;
    int queued;
    int cancelled;
    mc_http_req *prev, *next;   /* active list */
    mc_http_req *qprev, *qnext; /* news queue */
    int self_ref, cb_ref, data_ref, head_ref, body_ref;
    int streaming;
    size_t max_body;
    long status;
    int head_done, head_pending;
    int want_h2;               /* http_version '2': an answer in another version fails */
    mc_http_buf head, body, pend, trail;
    /* a failure noticed inside a curl callback, acted upon after it */
    const char *fail_code;
    const char *fail_msg;
    /* outcome, valid once state >= MC_HTTP_DONE; err_code NULL = success */
    const char *err_code;
    long curl_code;            /* -1: no curl error number */
    char err_msg[CURL_ERROR_SIZE + 32];
    char errbuf[CURL_ERROR_SIZE];
};

static int mc_http_global_ready = 0;

static void mc_http_schedule(mc_http_multi *m);

/* {======================================================
** Buffers and lists
** =======================================================*/

/* Appends n bytes; the buffer never grows beyond limit. Returns -1 on failure. */
static int mc_http_buf_add(mc_http_buf *b, const char *p, size_t n, size_t limit) {
    return mc_buf_add(b, p, n, limit, 4096);
}


/* Puts r on the news queue (once). Pure C: safe inside curl callbacks. */
static void mc_http_queue(mc_http_req *r) {
    mc_http_multi *m = r->m;
    if (m == NULL || r->queued) return;
    r->queued = 1;
    r->qnext = NULL;
    r->qprev = m->q_tail;
    if (m->q_tail) m->q_tail->qnext = r;
    else m->q_head = r;
    m->q_tail = r;
}

static void mc_http_unqueue(mc_http_req *r) {
    mc_http_multi *m = r->m;
    if (m == NULL || !r->queued) return;
    if (r->qprev) r->qprev->qnext = r->qnext;
    else m->q_head = r->qnext;
    if (r->qnext) r->qnext->qprev = r->qprev;
    else m->q_tail = r->qprev;
    r->qprev = r->qnext = NULL;
    r->queued = 0;
}

static void mc_http_link_active(mc_http_req *r) {
    mc_http_multi *m = r->m;
    r->prev = NULL;
    r->next = m->active;
    if (m->active) m->active->prev = r;
    m->active = r;
}

static void mc_http_unlink_active(mc_http_req *r) {
    mc_http_multi *m = r->m;
    if (r->prev) r->prev->next = r->next;
    else if (m != NULL && m->active == r) m->active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* Notes a failure inside a curl callback; the request is finished after the curl call returns. */
static void mc_http_note_fail(mc_http_req *r, const char *code, const char *msg) {
    if (r->fail_code == NULL) {
        r->fail_code = code;
        r->fail_msg = msg;
    }
    mc_http_queue(r);
}

/* }====================================================== */

/* {======================================================
** Finishing a transfer (never inside a curl call)
** =======================================================*/

/* Takes the easy handle out of the multi and frees it: the outcome is kept in r. */
static void mc_http_detach(mc_http_req *r) {
    mc_http_multi *m = r->m;
    if (r->easy != NULL) {
        if (r->status == 0) {
            long code = 0;
            if (curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK) r->status = code;
        }
        if (r->in_multi && m != NULL && m->multi != NULL) curl_multi_remove_handle(m->multi, r->easy);
        curl_easy_cleanup(r->easy);
        r->easy = NULL;
    }
    if (r->in_multi) {
        mc_http_unlink_active(r);
        r->in_multi = 0;
    }
    curl_slist_free_all(r->hlist);
    r->hlist = NULL;
}

/*
** Records the outcome (code NULL = success) and queues the final callback.
** A request already done but not yet delivered takes a cancellation: until
** its callback has run, cancel() wins.
*/
static void mc_http_finish(mc_http_req *r, const char *code, const char *msg, long curl_code) {
    if (r->state == MC_HTTP_DELIVERED) return;
    snprintf(r->err_msg, sizeof r->err_msg, "%s", msg != NULL ? msg : "");
    r->err_code = code;
    r->curl_code = curl_code;
    if (r->state == MC_HTTP_ACTIVE) {
        mc_http_detach(r);
        r->state = MC_HTTP_DONE;
    }
    if (code == MC_HTTP_CANCELLED) {
        /* A cancelled request hears nothing more but its final callback. */
        r->cancelled = 1;
        r->head_pending = 0;
        r->pend.len = 0;
    }
    mc_http_queue(r);
}

static const char *mc_http_code_of(CURLcode rc) {
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return "TIMEOUT";
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return "CONNECT_FAILED";
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return "INVALID_INPUT";
    default:
        return "NETWORK_ERROR";
    }
}

/* A DONE message from curl_multi_info_read. */
static void mc_http_complete(mc_http_req *r, CURLcode rc) {
    if (r->fail_code != NULL)
        mc_http_finish(r, r->fail_code, r->fail_msg, (long)rc);
    else if (rc == CURLE_OK)
        mc_http_finish(r, NULL, "", -1);
    else
        mc_http_finish(r, mc_http_code_of(rc), r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc), (long)rc);
}

/* Finishes every transfer curl reports done, and those failed in our own callbacks. */
static void mc_http_collect(mc_http_multi *m) {
    CURLMsg *msg;
    int left;
    mc_http_req *r, *next;
    while ((msg = curl_multi_info_read(m->multi, &left)) != NULL) {
        CURL *e = msg->easy_handle;
        CURLcode rc = msg->data.result;
        char *priv = NULL;
        if (msg->msg != CURLMSG_DONE) continue;
        if (curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv) != CURLE_OK || priv == NULL) continue;
        r = (mc_http_req *)(void *)priv;
        if (r->state == MC_HTTP_ACTIVE) mc_http_complete(r, rc);
    }
    /* A socket we could not watch: curl would wait for it until the timeout. */
    for (r = m->active; r != NULL; r = next) {
        next = r->next;
        if (r->fail_code != NULL && r->state == MC_HTTP_ACTIVE)
            mc_http_finish(r, r->fail_code, r->fail_msg, -1);
    }
}

/* }====================================================== */

/* {======================================================
** Delivery to Lua (main thread, outside curl)
** =======================================================*/

/* Pushes the table of header lines in b: lower-cased names, repeats joined with ", ". */
static void mc_http_push_headers(lua_State *L, const mc_http_buf *b) {
    const char *p = b->p, *end = b->p + b->len;
    int t, last;
    lua_newtable(L);
    t = lua_gettop(L);
    lua_pushnil(L); /* the last name, for folded lines */
    last = t + 1;
    while (p != NULL && p < end) {
        const char *eol = (const char *)memchr(p, '\n', (size_t)(end - p));
        const char *le = eol ? eol : end;
        const char *next = eol ? eol + 1 : end;
        const char *v, *ve;
        while (le > p && (le[-1] == '\r' || le[-1] == '\n')) le--;
        if (le == p) { p = next; continue; }
        if (*p == ' ' || *p == '\t') {
            /* obs-fold: the line continues the previous value (one space between, blanks trimmed) */
            v = p;
            ve = le;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (!lua_isnil(L, last) && ve > v) {
                lua_pushvalue(L, last);
                lua_pushvalue(L, last);
                lua_rawget(L, t);
                if (lua_rawlen(L, -1) > 0) {
                    lua_pushliteral(L, " ");
                    lua_pushlstring(L, v, (size_t)(ve - v));
                    lua_concat(L, 3);
                } else {
                    lua_pop(L, 1);
                    lua_pushlstring(L, v, (size_t)(ve - v));
                }
                lua_rawset(L, t);
            }
        } else {
            const char *colon = (const char *)memchr(p, ':', (size_t)(le - p));
            const char *ne;
            luaL_Buffer nb;
            const char *q;
            if (colon == NULL) { p = next; continue; }
            ne = colon;
            while (ne > p && (ne[-1] == ' ' || ne[-1] == '\t')) ne--;
            v = colon + 1;
            ve = le;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            luaL_buffinit(L, &nb);
            for (q = p; q < ne; q++) luaL_addchar(&nb, (char)((*q >= 'A' && *q <= 'Z') ? *q + 32 : *q));
            luaL_pushresult(&nb);
            lua_replace(L, last);
            lua_pushvalue(L, last);
            lua_pushvalue(L, last);
            lua_rawget(L, t);
            if (lua_isnil(L, -1)) {
                lua_pop(L, 1);
                lua_pushlstring(L, v, (size_t)(ve - v));
            } else {
                lua_pushliteral(L, ", ");
                lua_pushlstring(L, v, (size_t)(ve - v));
                lua_concat(L, 3);
            }
            lua_rawset(L, t);
        }
        p = next;
    }
    lua_pop(L, 1);
}

/*
** Calls the function below nargs arguments like mc_call, keeping the first
** result: 1 when it is false exactly, 0 otherwise, -1 on an error.
*/
static int mc_http_call_check(lua_State *L, int nargs) {
    int res = 0;
    if (mc_pcall_report(L, nargs, 1) != LUA_OK) return -1;
    if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)) res = 1;
    lua_pop(L, 1);
    return res;
}

static void mc_http_unref(lua_State *L, int *ref) {
    if (*ref != LUA_NOREF && *ref != LUA_REFNIL) luaL_unref(L, LUA_REGISTRYINDEX, *ref);
    *ref = LUA_NOREF;
}

/* Drops what a delivered request still holds, including its anchor. */
static void mc_http_release(lua_State *L, mc_http_req *r) {
    mc_buf_free(&r->head);
    mc_buf_free(&r->trail);
    mc_buf_free(&r->body);
    mc_buf_free(&r->pend);
    mc_http_unref(L, &r->cb_ref);
    mc_http_unref(L, &r->data_ref);
    mc_http_unref(L, &r->head_ref);
    mc_http_unref(L, &r->body_ref);
    mc_http_unref(L, &r->self_ref);
}

/* Calls the final callback; r may be collected once this returns. */
static void mc_http_final(lua_State *L, mc_http_req *r) {
    int nargs;
    mc_http_unqueue(r);
    r->state = MC_HTTP_DELIVERED;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->cb_ref);
    if (r->err_code == NULL) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, (lua_Integer)r->status);
        lua_setfield(L, -2, "status");
        mc_http_push_headers(L, &r->head);
        lua_setfield(L, -2, "headers");
        mc_http_push_headers(L, &r->trail);
        lua_setfield(L, -2, "trailers");
        lua_pushlstring(L, r->body.p != NULL ? r->body.p : "", r->body.len);
        lua_setfield(L, -2, "body");
        nargs = 1;
    } else {
        lua_pushnil(L);
        mc_push_error(L, r->err_code, "%s", r->err_msg);
        if (r->curl_code >= 0) {
            char num[32];
            snprintf(num, sizeof num, "%ld", r->curl_code);
            mc_error_field(L, "curl", num);
        }
        nargs = 2;
    }
    /* The callback and its arguments are on the stack: r needs nothing more. */
    mc_http_release(L, r);
    mc_call(L, nargs);
}

/* Delivers r's news: head, then data, then the outcome. */
static void mc_http_deliver(lua_State *L, mc_http_req *r) {
    if (r->state == MC_HTTP_DELIVERED) return;
    if (r->head_pending && !r->cancelled) {
        r->head_pending = 0;
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->head_ref);
        lua_pushinteger(L, (lua_Integer)r->status);
        mc_http_push_headers(L, &r->head);
        if (mc_call(L, 2) != 0) mc_http_finish(r, MC_HTTP_CANCELLED, "on_headers raised an error", -1);
    }
    while (r->pend.len > 0 && !r->cancelled && r->state != MC_HTTP_DELIVERED) {
        int rc;
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->data_ref);
        lua_pushlstring(L, r->pend.p, r->pend.len);
        r->pend.len = 0;
        if (r->pend.cap > MC_HTTP_KEEP_PEND) mc_buf_free(&r->pend);
        rc = mc_http_call_check(L, 1);
        if (rc == 1) mc_http_finish(r, MC_HTTP_CANCELLED, "on_data returned false", -1);
        else if (rc < 0) mc_http_finish(r, MC_HTTP_CANCELLED, "on_data raised an error", -1);
    }
    if (r->state == MC_HTTP_DONE) mc_http_final(L, r);
}

/* The delivery loop, run protected: a memory error must not unwind through libuv. */
static int mc_http_l_deliver(lua_State *L) {
    mc_http_multi *m = (mc_http_multi *)lua_touserdata(L, 1);
    mc_http_req *r;
    luaL_checkstack(L, 16, "http delivery");
    while ((r = m->q_head) != NULL) {
        mc_http_unqueue(r);
        mc_http_deliver(L, r);
    }
    return 0;
}

/*
** Also arms the kick idle handle after delivering: libuv's UV_RUN_ONCE runs
** due timers before it polls, so a callback that ends a wait from a timer
** (curl's timeout, say) would be followed by a poll that blocks; an active
** idle handle makes that poll return at once. The handle stops itself on
** its next turn when there is no news.
*/
static void mc_http_deliver_all(mc_http_multi *m) {
    lua_State *L = m->L;
    if (m->delivering || m->closed || m->q_head == NULL) return;
    m->delivering = 1;
    lua_pushcfunction(L, mc_http_l_deliver);
    lua_pushlightuserdata(L, m);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        fprintf(stderr, "mayura: http delivery failed: %s\n",
                lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(no message)");
        fflush(stderr);
        lua_pop(L, 1);
    }
    m->delivering = 0;
    mc_http_schedule(m);
}

static void mc_http_on_kick(uv_idle_t *h) {
    mc_http_multi *m = (mc_http_multi *)h->data;
    if (m->q_head == NULL || m->closed) uv_idle_stop(h);
    else mc_http_deliver_all(m);
}

/* News that arose outside a curl action is delivered on the next loop turn. */
static void mc_http_schedule(mc_http_multi *m) {
    if (m->delivering || m->closed || m->loop_gone || m->kick == NULL) return;
    uv_idle_start(m->kick, mc_http_on_kick);
}

/* }====================================================== */

/* {======================================================
** curl <-> libuv
** =======================================================*/

static void mc_http_action(mc_http_multi *m, curl_socket_t fd, int flags) {
    int running = 0;
    m->in_action = 1;
    curl_multi_socket_action(m->multi, fd, flags, &running);
    m->in_action = 0;
    mc_http_collect(m);
    mc_http_deliver_all(m);
}

static void mc_http_sock_free(uv_handle_t *h) {
    free(h); /* the poll handle is the first member of mc_http_sock */
}

static void mc_http_sock_close(mc_http_sock *sk) {
    mc_http_multi *m = sk->m;
    if (m != NULL) {
        if (sk->prev) sk->prev->next = sk->next;
        else if (m->socks == sk) m->socks = sk->next;
        if (sk->next) sk->next->prev = sk->prev;
    }
    sk->prev = sk->next = NULL;
    sk->m = NULL;
    if (sk->closed) return;
    sk->closed = 1;
    if (uv_is_closing((uv_handle_t *)&sk->poll)) {
        /* closed by the loop's owner while the state closes: its loop run has ended */
        free(sk);
        return;
    }
    uv_close((uv_handle_t *)&sk->poll, mc_http_sock_free);
}

static void mc_http_on_poll(uv_poll_t *h, int status, int events) {
    mc_http_sock *sk = (mc_http_sock *)h->data;
    mc_http_multi *m = sk->m;
    int flags = 0;
    if (m == NULL || sk->closed) return;
    if (status < 0) {
        /* libuv stops the handle on an error; let curl read the error itself */
        flags = CURL_CSELECT_ERR | CURL_CSELECT_IN | CURL_CSELECT_OUT;
    } else {
        if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
        if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
    }
    mc_http_action(m, sk->fd, flags);
    /* sk is still allocated (freed by uv_close's callback), but may be closed now */
    if (status < 0 && !sk->closed && !uv_is_active((uv_handle_t *)&sk->poll) && sk->events != 0)
        uv_poll_start(&sk->poll, sk->events, mc_http_on_poll);
}

static mc_http_req *mc_http_req_of(CURL *e) {
    char *priv = NULL;
    if (e == NULL || curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv) != CURLE_OK) return NULL;
    return (mc_http_req *)(void *)priv;
}

/* CURLMOPT_SOCKETFUNCTION: watch s for `what`, or stop watching it. */
static int mc_http_on_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp) {
    mc_http_multi *m = (mc_http_multi *)userp;
    mc_http_sock *sk = (mc_http_sock *)socketp;
    int events = 0, rc;
    if (what == CURL_POLL_REMOVE) {
        if (sk != NULL) {
            curl_multi_assign(m->multi, s, NULL);
            mc_http_sock_close(sk);
        }
        return 0;
    }
    if (m->loop_gone || m->closed) return 0;
    if (sk == NULL) {
        mc_http_sock *old;
        /*
        ** A socket we still watch with the same number was closed without a
        ** REMOVE: drop its poll first, libuv allows one watcher per fd.
        */
        for (old = m->socks; old != NULL; old = old->next)
            if (old->fd == s) { mc_http_sock_close(old); break; }
        sk = (mc_http_sock *)calloc(1, sizeof *sk);
        if (sk == NULL) {
            mc_http_req *r = mc_http_req_of(e);
            if (r != NULL) mc_http_note_fail(r, MC_OOM_CODE, MC_OOM_MSG);
            return 0;
        }
        if (uv_poll_init_socket(m->loop, &sk->poll, s) != 0) {
            mc_http_req *r = mc_http_req_of(e);
            free(sk);
            if (r != NULL) mc_http_note_fail(r, "NETWORK_ERROR", "cannot watch the socket");
            return 0;
        }
        sk->poll.data = sk;
        sk->fd = s;
        sk->m = m;
        sk->next = m->socks;
        if (m->socks) m->socks->prev = sk;
        m->socks = sk;
        curl_multi_assign(m->multi, s, sk);
    }
    if (what & CURL_POLL_IN) events |= UV_READABLE;
    if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
    sk->events = events;
    if (events == 0) rc = uv_poll_stop(&sk->poll);
    else rc = uv_poll_start(&sk->poll, events, mc_http_on_poll);
    if (rc != 0) {
        mc_http_req *r = mc_http_req_of(e);
        if (r != NULL) mc_http_note_fail(r, "NETWORK_ERROR", "cannot watch the socket");
    }
    return 0;
}

static void mc_http_on_timeout(uv_timer_t *t) {
    mc_http_multi *m = (mc_http_multi *)t->data;
    if (m->closed) return;
    mc_http_action(m, CURL_SOCKET_TIMEOUT, 0);
}

/* CURLMOPT_TIMERFUNCTION: never acts at once (that would re-enter curl), a 0 ms timer does. */
static int mc_http_on_timer(CURLM *multi, long timeout_ms, void *userp) {
    mc_http_multi *m = (mc_http_multi *)userp;
    (void)multi;
    if (m->loop_gone || m->closed) return 0;
    if (timeout_ms < 0) {
        uv_timer_stop(m->timer);
    } else {
        /* curl counts from now; the loop's cached time may be old if Lua ran long since */
        uv_update_time(m->loop);
        uv_timer_start(m->timer, mc_http_on_timeout, (uint64_t)timeout_ms, 0);
    }
    return 0;
}

/* CURLOPT_WRITEFUNCTION: keeps the body (or the chunk for on_data). No Lua here. */
static size_t mc_http_on_write(char *p, size_t size, size_t nmemb, void *ud) {
    mc_http_req *r = (mc_http_req *)ud;
    size_t n = size * nmemb;
    if (r->fail_code != NULL || r->state != MC_HTTP_ACTIVE) return 0;
    if (r->streaming) {
        if (mc_http_buf_add(&r->pend, p, n, SIZE_MAX) != 0) {
            mc_http_note_fail(r, MC_OOM_CODE, MC_OOM_MSG);
            return 0;
        }
        if (n > 0) mc_http_queue(r);
        return n;
    }
    if (n > r->max_body - r->body.len) {
        mc_http_note_fail(r, "LIMIT_EXCEEDED", "the response body is larger than max_body_bytes");
        return 0;
    }
    if (mc_http_buf_add(&r->body, p, n, r->max_body) != 0) {
        mc_http_note_fail(r, MC_OOM_CODE, MC_OOM_MSG);
        return 0;
    }
    return n;
}

/* CURLOPT_HEADERFUNCTION: keeps the lines of the latest response head. No Lua here. */
static size_t mc_http_on_header(char *p, size_t size, size_t nitems, void *ud) {
    mc_http_req *r = (mc_http_req *)ud;
    size_t n = size * nitems;
    if (r->fail_code != NULL || r->state != MC_HTTP_ACTIVE) return 0;
    if (n >= 5 && memcmp(p, "HTTP/", 5) == 0) {
        /* A status line starts a new head (after a 100 Continue, say): forget the last one. */
        size_t i = 5;
        long st = 0;
        if (r->want_h2 && !(n >= 6 && p[5] == '2')) {
            mc_http_note_fail(r, "NETWORK_ERROR", "the server did not answer in HTTP/2");
            return 0;
        }
        while (i < n && p[i] != ' ') i++;
        while (i < n && p[i] == ' ') i++;
        while (i < n && p[i] >= '0' && p[i] <= '9' && st < 1000) st = st * 10 + (p[i++] - '0');
        r->status = st;
        r->head.len = 0;
        r->trail.len = 0;
        r->head_done = 0;
        return n;
    }
    if (r->head_done) {
        /* trailers, after the body */
        if (n == 0 || p[0] == '\r' || p[0] == '\n') return n;
        if (mc_http_buf_add(&r->trail, p, n, MC_HTTP_MAX_HEAD) != 0) {
            mc_http_note_fail(r, "LIMIT_EXCEEDED", "the response trailers are too large");
            return 0;
        }
        return n;
    }
    if (n == 0 || p[0] == '\r' || p[0] == '\n') {
        if (r->status >= 100 && r->status < 200) return n; /* interim: the real head follows */
        r->head_done = 1;
        if (r->head_ref != LUA_NOREF) {
            r->head_pending = 1;
            mc_http_queue(r);
        }
        return n;
    }
    if (mc_http_buf_add(&r->head, p, n, MC_HTTP_MAX_HEAD) != 0) {
        mc_http_note_fail(r, "LIMIT_EXCEEDED", "the response head is too large");
        return 0;
    }
    return n;
}

/* }====================================================== */

/* {======================================================
** The multi handle
** =======================================================*/

static void mc_http_handle_free(uv_handle_t *h) {
    free(h);
}

static void mc_http_close_handle(uv_handle_t *h) {
    if (h == NULL) return;
    if (uv_is_closing(h)) free(h); /* closed by the loop's owner, whose run has ended */
    else uv_close(h, mc_http_handle_free);
}

static int l_http_multi_gc(lua_State *L) {
    mc_http_multi *m = (mc_http_multi *)lua_touserdata(L, 1);
    mc_http_req *r;
    if (m == NULL || m->closed) return 0;
    /* luv finalises its loop after us; if it went first, our handles are closed already */
    if (m->timer != NULL && uv_is_closing((uv_handle_t *)m->timer)) m->loop_gone = 1;
    m->closed = 1;
    while ((r = m->active) != NULL) {
        if (m->multi != NULL && r->easy != NULL) curl_multi_remove_handle(m->multi, r->easy);
        r->in_multi = 0;
        mc_http_unlink_active(r);
        r->m = NULL;
    }
    while ((r = m->q_head) != NULL) {
        mc_http_unqueue(r);
        r->m = NULL;
    }
    if (m->multi != NULL) curl_multi_cleanup(m->multi);
    m->multi = NULL;
    while (m->socks != NULL) mc_http_sock_close(m->socks);
    mc_http_close_handle((uv_handle_t *)m->timer);
    mc_http_close_handle((uv_handle_t *)m->kick);
    m->timer = NULL;
    m->kick = NULL;
    return 0;
}

static uv_timer_t *mc_http_new_timer(uv_loop_t *loop, mc_http_multi *m) {
    uv_timer_t *t = (uv_timer_t *)malloc(sizeof *t);
    if (t == NULL) return NULL;
    if (uv_timer_init(loop, t) != 0) { free(t); return NULL; }
    t->data = m;
    return t;
}

static uv_idle_t *mc_http_new_idle(uv_loop_t *loop, mc_http_multi *m) {
    uv_idle_t *h = (uv_idle_t *)malloc(sizeof *h);
    if (h == NULL) return NULL;
    if (uv_idle_init(loop, h) != 0) { free(h); return NULL; }
    h->data = m;
    return h;
}

/* Descriptors below this are looked at for the ones libcurl opens in curl_multi_init. */
#define MC_HTTP_FD_SCAN 1024

/*
** Called around curl_multi_init, which opens a socket pair without close-on-exec (its wake-up
** pair) and gives no way to reach it: before (after = 0) it notes which descriptors are open,
** after (1) it gives close-on-exec to those that were not.
*/
static void mc_http_new_fds(unsigned char *open_before, int after) {
    int fd;
    for (fd = 3; fd < MC_HTTP_FD_SCAN; fd++) {
        int flags = fcntl(fd, F_GETFD);
        unsigned char bit = (unsigned char)(1u << (fd % 8));
        if (!after) {
            if (flags >= 0) open_before[fd / 8] |= bit;
            else open_before[fd / 8] &= (unsigned char)~bit;
        } else if (flags >= 0 && !(open_before[fd / 8] & bit) && !(flags & FD_CLOEXEC)) {
            (void)fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
        }
    }
}

/* The state's multi handle, made on first use. */
static mc_http_multi *mc_http_get_multi(lua_State *L) {
    unsigned char open_before[MC_HTTP_FD_SCAN / 8];
    mc_http_multi *m;
    uv_loop_t *loop;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_HTTP_MULTI_KEY);
    m = (mc_http_multi *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (m != NULL) {
        if (m->closed) mc_raise(L, "INVALID_INPUT", "http is shut down");
        return m;
    }
    loop = mc_loop(L);
    if (!mc_http_global_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            mc_raise(L, "NETWORK_ERROR", "libcurl cannot be initialised");
        mc_http_global_ready = 1;
    }
    m = (mc_http_multi *)mc_handle_new(L, &mc_http_multi_class);
    m->loop = loop;
    m->L = mc_main(L);
    if ((m->timer = mc_http_new_timer(loop, m)) == NULL || (m->kick = mc_http_new_idle(loop, m)) == NULL)
        mc_raise_oom(L);
    mc_http_new_fds(open_before, 0);
    if ((m->multi = curl_multi_init()) == NULL) mc_raise_oom(L);
    mc_http_new_fds(open_before, 1);   /* its wake-up socket pair: close-on-exec too */
    if (curl_multi_setopt(m->multi, CURLMOPT_SOCKETFUNCTION, mc_http_on_socket) != CURLM_OK ||
        curl_multi_setopt(m->multi, CURLMOPT_SOCKETDATA, (void *)m) != CURLM_OK ||
        curl_multi_setopt(m->multi, CURLMOPT_TIMERFUNCTION, mc_http_on_timer) != CURLM_OK ||
        curl_multi_setopt(m->multi, CURLMOPT_TIMERDATA, (void *)m) != CURLM_OK)
        mc_raise(L, "NETWORK_ERROR", "libcurl refused the multi options");
    lua_setfield(L, LUA_REGISTRYINDEX, MC_HTTP_MULTI_KEY);
    return m;
}

/* }====================================================== */

/* {======================================================
** core.http.request and the request object
** =======================================================*/

static const char *const mc_http_keys[] = {
    "url", "method", "headers", "body", "timeout_ms", "connect_timeout_ms",
    "unix_socket", "on_data", "max_body_bytes", "on_headers", "aws_sigv4", "aws_key_id", "aws_secret",
    "http_version", "ca_file", "ca_pem", "client_cert", "client_key", NULL
};

/* An option naming a file: 1 when given (a string without NUL, of a path's length), 0 when nil. */
static int mc_http_path_opt(lua_State *L, const char *name) {
    int given = 0;
    lua_getfield(L, 1, name);
    if (!lua_isnil(L, -1)) {
        size_t n;
        const char *v;
        if (lua_type(L, -1) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option '%s' must be a string", name);
        v = lua_tolstring(L, -1, &n);
        if (n == 0 || n >= PATH_MAX || strlen(v) != n)
            mc_raise(L, "INVALID_INPUT", "option '%s' is empty, too long or holds a NUL byte", name);
        given = 1;
    }
    lua_pop(L, 1);
    return given;
}

/* An RFC 9110 token character (method and header names). */
static int mc_http_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int mc_http_is_token(const char *s, size_t len) {
    size_t i;
    if (len == 0) return 0;
    for (i = 0; i < len; i++)
        if (!mc_http_tchar((unsigned char)s[i])) return 0;
    return 1;
}

static int mc_http_clean_value(const char *s, size_t len) {
    size_t i;
    for (i = 0; i < len; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0') return 0;
    return 1;
}

static int mc_http_ieq(const char *a, size_t alen, const char *b) {
    size_t i;
    if (alen != strlen(b)) return 0;
    for (i = 0; i < alen; i++) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c + 32);
        if (c != b[i]) return 0;
    }
    return 1;
}

/*
** Checks the headers table at idx (a map name -> value and/or an array of
** "Name: value" lines). Returns whether a Content-Type is among them.
*/
static int mc_http_check_headers(lua_State *L, int idx) {
    int has_ctype = 0;
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        size_t klen, vlen;
        const char *k, *v;
        if (lua_type(L, -1) != LUA_TSTRING)
            mc_raise(L, "INVALID_INPUT", "header values must be strings");
        v = lua_tolstring(L, -1, &vlen);
        if (!mc_http_clean_value(v, vlen))
            mc_raise(L, "INVALID_INPUT", "a header contains CR, LF or NUL");
        if (lua_type(L, -2) == LUA_TSTRING) {
            k = lua_tolstring(L, -2, &klen);
            if (!mc_http_is_token(k, klen)) mc_raise(L, "INVALID_INPUT", "invalid header name");
            if (mc_http_ieq(k, klen, "content-type")) has_ctype = 1;
        } else if (lua_isinteger(L, -2)) {
            const char *sep = v;
            while (sep < v + vlen && *sep != ':' && *sep != ';') sep++;
            if (sep == v + vlen || !mc_http_is_token(v, (size_t)(sep - v)))
                mc_raise(L, "INVALID_INPUT", "header lines must look like 'Name: value'");
            if (mc_http_ieq(v, (size_t)(sep - v), "content-type")) has_ctype = 1;
        } else {
            mc_raise(L, "INVALID_INPUT", "header keys must be names or array indices");
        }
        lua_pop(L, 1);
    }
    return has_ctype;
}

static void mc_http_add_header(lua_State *L, mc_http_req *r, const char *line) {
    struct curl_slist *l = curl_slist_append(r->hlist, line);
    if (l == NULL) mc_raise_oom(L);
    r->hlist = l;
}

/* Builds the curl header list from the (checked) table at idx. */
static void mc_http_build_headers(lua_State *L, mc_http_req *r, int idx) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            /* "Name;" is curl's way to send an empty value ("Name:" would remove the header) */
            if (lua_rawlen(L, -1) == 0) lua_pushfstring(L, "%s;", lua_tostring(L, -2));
            else lua_pushfstring(L, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
            mc_http_add_header(L, r, lua_tostring(L, -1));
            lua_pop(L, 1);
        } else {
            mc_http_add_header(L, r, lua_tostring(L, -1));
        }
        lua_pop(L, 1);
    }
}

#define MC_HTTP_SETOPT(r, opt, val) \
    do { if (curl_easy_setopt((r)->easy, (opt), (val)) != CURLE_OK) \
        mc_raise(L, "INVALID_INPUT", "libcurl refused option %s", #opt); } while (0)

/* What core.http.request's options say, read and checked before anything is made. */
typedef struct mc_http_opts {
    const char *url, *method, *body, *sock;
    size_t url_len, method_len, body_len, sock_len;
    lua_Integer timeout, ctimeout, max_body;
    int has_headers, has_ctype, has_on_data, has_on_headers, has_sigv4, has_ca, has_ca_pem, has_cert, has_key;
    long version; /* CURLOPT_HTTP_VERSION, or 0 for libcurl's default */
} mc_http_opts;

/*
** Reads and checks the options table at index 1 into o; every check comes
** before anything is allocated. Leaves the option values the request
** keeps using on the stack at fixed places: 3 url, 4 method, 5 headers,
** 6 body, 7 unix_socket, 8 on_data, 9 on_headers (the top is 9).
** Raises INVALID_INPUT on a bad option.
*/
static void mc_http_read_opts(lua_State *L, mc_http_opts *o) {
    memset(o, 0, sizeof *o);
    o->method = "GET";
    o->method_len = 3;
    mc_check_keys(L, 1, mc_http_keys);

    lua_getfield(L, 1, "url"); /* 3 */
    if (lua_type(L, 3) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option 'url' must be a string");
    o->url = lua_tolstring(L, 3, &o->url_len);
    if (o->url_len == 0) mc_raise(L, "INVALID_INPUT", "option 'url' is empty");
    if (strlen(o->url) != o->url_len) mc_raise(L, "INVALID_INPUT", "option 'url' contains a NUL byte");

    lua_getfield(L, 1, "method"); /* 4 */
    if (!lua_isnil(L, 4)) {
        if (lua_type(L, 4) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option 'method' must be a string");
        o->method = lua_tolstring(L, 4, &o->method_len);
        if (!mc_http_is_token(o->method, o->method_len) || o->method_len > 64)
            mc_raise(L, "INVALID_INPUT", "option 'method' is not a valid method name");
    }

    lua_getfield(L, 1, "headers"); /* 5 */
    o->has_headers = !lua_isnil(L, 5);
    if (o->has_headers) {
        if (!lua_istable(L, 5)) mc_raise(L, "INVALID_INPUT", "option 'headers' must be a table");
        o->has_ctype = mc_http_check_headers(L, 5);
    }

    lua_getfield(L, 1, "body"); /* 6 */
    if (!lua_isnil(L, 6)) {
        if (lua_type(L, 6) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option 'body' must be a string");
        o->body = lua_tolstring(L, 6, &o->body_len);
    }

    lua_getfield(L, 1, "unix_socket"); /* 7 */
    if (!lua_isnil(L, 7)) {
        if (lua_type(L, 7) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option 'unix_socket' must be a string");
        o->sock = lua_tolstring(L, 7, &o->sock_len);
        if (o->sock_len == 0) mc_raise(L, "INVALID_INPUT", "option 'unix_socket' is empty");
        if (strlen(o->sock) != o->sock_len) mc_raise(L, "INVALID_INPUT", "option 'unix_socket' contains a NUL byte");
        if (o->sock_len >= sizeof(((struct sockaddr_un *)0)->sun_path))
            mc_raise(L, "INVALID_INPUT", "option 'unix_socket' is too long for a socket path");
    }

    lua_getfield(L, 1, "on_data"); /* 8 */
    o->has_on_data = !lua_isnil(L, 8);
    if (o->has_on_data && lua_type(L, 8) != LUA_TFUNCTION)
        mc_raise(L, "INVALID_INPUT", "option 'on_data' must be a function");
    lua_getfield(L, 1, "on_headers"); /* 9 */
    o->has_on_headers = !lua_isnil(L, 9);
    if (o->has_on_headers && lua_type(L, 9) != LUA_TFUNCTION)
        mc_raise(L, "INVALID_INPUT", "option 'on_headers' must be a function");

    /* AWS Signature V4 by libcurl itself: the provider string and the key pair, which go
    ** nowhere else (never as Basic credentials: the pair is refused without aws_sigv4). */
    lua_getfield(L, 1, "aws_sigv4"); /* 10 */
    lua_getfield(L, 1, "aws_key_id"); /* 11 */
    lua_getfield(L, 1, "aws_secret"); /* 12 */
    if (!lua_isnil(L, 10) || !lua_isnil(L, 11) || !lua_isnil(L, 12)) {
        size_t n;
        const char *v;
        int i;
        for (i = 10; i <= 12; i++) {
            if (lua_type(L, i) != LUA_TSTRING)
                mc_raise(L, "INVALID_INPUT", "options 'aws_sigv4', 'aws_key_id' and 'aws_secret' go together, as strings");
            v = lua_tolstring(L, i, &n);
            if (n == 0 || n > 1024 || strlen(v) != n)
                mc_raise(L, "INVALID_INPUT", "an AWS signing option is empty, too long or holds a NUL byte");
        }
        v = lua_tolstring(L, 10, &n);
        if (strncmp(v, "aws:amz:", 8) != 0)
            mc_raise(L, "INVALID_INPUT", "option 'aws_sigv4' must start with aws:amz:");
        o->has_sigv4 = 1;
    }
    lua_settop(L, 9);

    lua_getfield(L, 1, "http_version"); /* 10 */
    if (!lua_isnil(L, 10)) {
        const char *v = lua_type(L, 10) == LUA_TSTRING ? lua_tostring(L, 10) : "";
        if (strcmp(v, "1.1") == 0) {
            o->version = (long)CURL_HTTP_VERSION_1_1;
        } else if (strcmp(v, "2") == 0) {
            if (!(curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_HTTP2))
                mc_raise(L, "INVALID_INPUT", "this libcurl has no HTTP/2");
            o->version = strncmp(o->url, "http://", 7) == 0 ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE
                                                             : (long)CURL_HTTP_VERSION_2TLS;
        } else {
            mc_raise(L, "INVALID_INPUT", "option 'http_version' must be '1.1' or '2'");
        }
    }
    lua_settop(L, 9);

    /* the authorities to trust instead of the system's (a server with a test authority), a client
    ** certificate and its key */
    o->has_ca = mc_http_path_opt(L, "ca_file");
    lua_getfield(L, 1, "ca_pem");
    if (!lua_isnil(L, -1)) {
        size_t n;
        if (lua_type(L, -1) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "option 'ca_pem' must be a string");
        lua_tolstring(L, -1, &n);
        if (n == 0 || n > ((size_t)1 << 20)) mc_raise(L, "INVALID_INPUT", "option 'ca_pem' is empty or too long");
        if (o->has_ca) mc_raise(L, "INVALID_INPUT", "options 'ca_file' and 'ca_pem' do not go together");
        o->has_ca_pem = 1;
    }
    lua_pop(L, 1);
    o->has_cert = mc_http_path_opt(L, "client_cert");
    o->has_key = mc_http_path_opt(L, "client_key");
    if (o->has_cert != o->has_key) mc_raise(L, "INVALID_INPUT", "options 'client_cert' and 'client_key' go together");

    o->timeout = mc_opt_int(L, 1, "timeout_ms", 0, 0, LONG_MAX);
    o->ctimeout = mc_opt_int(L, 1, "connect_timeout_ms", 0, 0, LONG_MAX);
    o->max_body = mc_opt_int(L, 1, "max_body_bytes", MC_HTTP_DEFAULT_MAX_BODY, 0, MC_MAX_SAFE_INT);
}

/*
** libcurl opens its sockets without close-on-exec: a command the host starts during a transfer
** would hold the connection (to a hosted service, with its credentials in flight). Each socket
** gets it as it is made.
*/
static int mc_http_on_sockopt(void *data, curl_socket_t fd, curlsocktype purpose) {
    (void)data;
    (void)purpose;
    (void)fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
    return CURL_SOCKOPT_OK;
}

/* Makes r's easy handle and sets every option of the transfer o describes. Raises on failure
** (r, owned by its userdata, is then cleaned up by __gc). */
static void mc_http_setup_easy(lua_State *L, mc_http_req *r, const mc_http_opts *o) {
    if ((r->easy = curl_easy_init()) == NULL) mc_raise_oom(L);
    MC_HTTP_SETOPT(r, CURLOPT_PRIVATE, (void *)r);
    MC_HTTP_SETOPT(r, CURLOPT_SOCKOPTFUNCTION, mc_http_on_sockopt);
    MC_HTTP_SETOPT(r, CURLOPT_NOSIGNAL, 1L);
    MC_HTTP_SETOPT(r, CURLOPT_ERRORBUFFER, r->errbuf);
    MC_HTTP_SETOPT(r, CURLOPT_URL, o->url);
#if LIBCURL_VERSION_NUM >= 0x075500
    MC_HTTP_SETOPT(r, CURLOPT_PROTOCOLS_STR, "http,https");
    MC_HTTP_SETOPT(r, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    MC_HTTP_SETOPT(r, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    MC_HTTP_SETOPT(r, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    MC_HTTP_SETOPT(r, CURLOPT_WRITEFUNCTION, mc_http_on_write);
    MC_HTTP_SETOPT(r, CURLOPT_WRITEDATA, (void *)r);
    MC_HTTP_SETOPT(r, CURLOPT_HEADERFUNCTION, mc_http_on_header);
    MC_HTTP_SETOPT(r, CURLOPT_HEADERDATA, (void *)r);
    if (o->version != 0) MC_HTTP_SETOPT(r, CURLOPT_HTTP_VERSION, o->version);
    if (o->version == (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE || o->version == (long)CURL_HTTP_VERSION_2TLS)
        r->want_h2 = 1;
    if (o->version == (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) {
        /* libcurl 7.88 breaks the next request on a reused h2c connection ("Error in the HTTP2
        ** framing layer"): each such request has a connection of its own. */
        MC_HTTP_SETOPT(r, CURLOPT_FRESH_CONNECT, 1L);
        MC_HTTP_SETOPT(r, CURLOPT_FORBID_REUSE, 1L);
    }
    if (o->timeout > 0) MC_HTTP_SETOPT(r, CURLOPT_TIMEOUT_MS, (long)o->timeout);
    if (o->ctimeout > 0) MC_HTTP_SETOPT(r, CURLOPT_CONNECTTIMEOUT_MS, (long)o->ctimeout);
    if (o->sock != NULL) {
        MC_HTTP_SETOPT(r, CURLOPT_UNIX_SOCKET_PATH, o->sock);
        /* a local socket is never reached through a proxy from the environment */
        MC_HTTP_SETOPT(r, CURLOPT_NOPROXY, "*");
    }

    if (o->body != NULL || mc_http_ieq(o->method, o->method_len, "post")) {
        MC_HTTP_SETOPT(r, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->body_len);
        MC_HTTP_SETOPT(r, CURLOPT_POSTFIELDS, o->body != NULL ? o->body : "");
        if (strcmp(o->method, "POST") != 0) MC_HTTP_SETOPT(r, CURLOPT_CUSTOMREQUEST, o->method);
        /* curl would label the body as a form; the caller says what it is */
        if (!o->has_ctype) mc_http_add_header(L, r, "Content-Type:");
    } else if (strcmp(o->method, "HEAD") == 0) {
        MC_HTTP_SETOPT(r, CURLOPT_NOBODY, 1L);
    } else if (strcmp(o->method, "GET") != 0) {
        MC_HTTP_SETOPT(r, CURLOPT_CUSTOMREQUEST, o->method);
    }
    if (o->has_headers) mc_http_build_headers(L, r, 5);
    if (r->hlist != NULL) MC_HTTP_SETOPT(r, CURLOPT_HTTPHEADER, r->hlist);
    if (o->has_sigv4) {
        /* libcurl copies these strings: nothing of them stays here */
        lua_getfield(L, 1, "aws_sigv4");
        MC_HTTP_SETOPT(r, CURLOPT_AWS_SIGV4, lua_tostring(L, -1));
        lua_getfield(L, 1, "aws_key_id");
        MC_HTTP_SETOPT(r, CURLOPT_USERNAME, lua_tostring(L, -1));
        lua_getfield(L, 1, "aws_secret");
        MC_HTTP_SETOPT(r, CURLOPT_PASSWORD, lua_tostring(L, -1));
        lua_pop(L, 3);
    }
    if (o->has_ca) {
        lua_getfield(L, 1, "ca_file");   /* copied by libcurl too */
        MC_HTTP_SETOPT(r, CURLOPT_CAINFO, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    if (o->has_ca_pem) {
        struct curl_blob blob;
        size_t n;
        lua_getfield(L, 1, "ca_pem");
        blob.data = (void *)lua_tolstring(L, -1, &n);
        blob.len = n;
        blob.flags = CURL_BLOB_COPY;   /* libcurl keeps its own copy */
        MC_HTTP_SETOPT(r, CURLOPT_CAINFO_BLOB, &blob);
        lua_pop(L, 1);
    }
    if (o->has_cert) {
        lua_getfield(L, 1, "client_cert");
        lua_getfield(L, 1, "client_key");
        MC_HTTP_SETOPT(r, CURLOPT_SSLCERT, lua_tostring(L, -2));
        MC_HTTP_SETOPT(r, CURLOPT_SSLKEY, lua_tostring(L, -1));
        lua_pop(L, 2);
    }
}

/*
** core.http.request(opts, cb) -> request. The options are read first
** (mc_http_read_opts), then the request object is made, empty, and owns
** everything after (an error below is cleaned up by __gc), then the easy
** handle is set up (mc_http_setup_easy) and handed to the shared multi.
*/
static int l_http_request(lua_State *L) {
    mc_http_opts o;
    mc_http_multi *m;
    mc_http_req *r;

    if (!lua_istable(L, 1)) mc_raise(L, "INVALID_INPUT", "request options must be a table");
    if (lua_type(L, 2) != LUA_TFUNCTION) mc_raise(L, "INVALID_INPUT", "the callback must be a function");
    lua_settop(L, 2);
    mc_http_read_opts(L, &o);   /* 3..9 */

    m = mc_http_get_multi(L);

    r = (mc_http_req *)mc_handle_new(L, &mc_http_class); /* 10 */
    r->streaming = o.has_on_data;
    r->max_body = (uint64_t)o.max_body > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)o.max_body;

    lua_pushvalue(L, 2);
    r->cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (o.has_on_data) { lua_pushvalue(L, 8); r->data_ref = luaL_ref(L, LUA_REGISTRYINDEX); }
    if (o.has_on_headers) { lua_pushvalue(L, 9); r->head_ref = luaL_ref(L, LUA_REGISTRYINDEX); }
    /* curl sends the body from the Lua string itself, kept alive by this ref */
    if (o.body != NULL) { lua_pushvalue(L, 6); r->body_ref = luaL_ref(L, LUA_REGISTRYINDEX); }

    mc_http_setup_easy(L, r, &o);

    /* Anchored while in flight: the object cannot be collected mid-transfer. */
    lua_pushvalue(L, 10);
    r->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    r->m = m;
    if (curl_multi_add_handle(m->multi, r->easy) != CURLM_OK) {
        r->m = NULL;
        mc_http_unref(L, &r->self_ref);
        mc_raise(L, "NETWORK_ERROR", "libcurl refused the transfer");
    }
    r->in_multi = 1;
    r->state = MC_HTTP_ACTIVE;
    mc_http_link_active(r);
    lua_settop(L, 10);
    return 1;
}

/* request:cancel(): the callback gets (nil, CANCELLED) once; nothing after completion. */
static int l_http_cancel(lua_State *L) {
    mc_http_req *r = (mc_http_req *)luaL_checkudata(L, 1, MC_HTTP_MT);
    mc_http_multi *m = r->m;
    if (m == NULL || r->state == MC_HTTP_DELIVERED || r->cancelled) return 0;
    if (m->in_action) {
        /* cannot happen (no Lua runs inside curl), but never re-enter curl */
        mc_http_note_fail(r, MC_HTTP_CANCELLED, "the request was cancelled");
        return 0;
    }
    mc_http_finish(r, MC_HTTP_CANCELLED, "the request was cancelled", -1);
    mc_http_schedule(m);
    return 0;
}

static int l_http_req_gc(lua_State *L) {
    mc_http_req *r = (mc_http_req *)lua_touserdata(L, 1);
    if (r == NULL) return 0;
    if (r->m != NULL) mc_http_unqueue(r);
    mc_http_detach(r);
    r->m = NULL;
    mc_http_release(L, r);
    return 0;
}

/* An empty request: no reference held yet. */
static void mc_http_req_init(void *h) {
    mc_http_req *r = (mc_http_req *)h;
    r->self_ref = r->cb_ref = r->data_ref = r->head_ref = r->body_ref = LUA_NOREF;
    r->curl_code = -1;
}

static int l_http_req_tostring(lua_State *L) {
    mc_http_req *r = (mc_http_req *)luaL_checkudata(L, 1, MC_HTTP_MT);
    const char *st = r->state == MC_HTTP_ACTIVE ? "active" : r->state == MC_HTTP_DONE ? "done" : "finished";
    lua_pushfstring(L, "mayura.http_request (%s): %p", st, (void *)r);
    return 1;
}

/* }====================================================== */

static const luaL_Reg mc_http_req_methods[] = {
    {"cancel", l_http_cancel},
    {NULL, NULL}
};

static const luaL_Reg mc_http_funcs[] = {
    {"request", l_http_request},
    {NULL, NULL}
};

static const mc_class mc_http_class = { MC_HTTP_MT, sizeof(mc_http_req), l_http_req_gc, l_http_req_tostring,
                                        mc_http_req_methods, mc_http_req_init };
static const mc_class mc_http_multi_class = { MC_HTTP_MULTI_MT, sizeof(mc_http_multi), l_http_multi_gc, NULL, NULL,
                                              NULL };

static void mc_open_http(lua_State *L) {
    mc_class_register(L, &mc_http_class);
    mc_class_register(L, &mc_http_multi_class);
    luaL_newlib(L, mc_http_funcs);
    lua_setfield(L, -2, "http");
}
