/*
** http_fuzz: the header handling of core/http.c, through its own functions.
** The first byte picks the mode.
**
** 0  a response head as curl hands it over: the rest of the input cut
**    into lines (each in its own exactly sized buffer) fed to the header
**    callback mc_http_on_header of a request in flight; then the kept
**    head (copied to an exactly sized buffer) through mc_http_push_headers
**    into a Lua table. The callback takes every line (or fails the request
**    with a code), the status stays within 0..9999, and in the table every
**    name is lower case without ':' or a line break, every value is
**    without a line break and trimmed of blanks (a folded line included).
**
** 1  request headers: a table shaped by the input (names to values, and
**    "Name: value" lines, and keys and values of other types) through
**    mc_http_check_headers, and when it takes them, mc_http_build_headers:
**    one curl line per entry, no CR or LF in any, each starting with a
**    token name, and Content-Type seen exactly when a name is content-type.
*/
#include "fuzz_lua.h"

/* {------------------------------------------------------ mode 0 */

static int push_head(lua_State *L) {
    mc_http_push_headers(L, (const mc_http_buf *)lua_touserdata(L, 1));
    return 1;
}

static void check_table(lua_State *L, int t) {
    lua_pushnil(L);
    while (lua_next(L, t) != 0) {
        size_t kl, vl, i;
        const char *k, *v;
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING) fz_fail("a header is not string = string");
        k = lua_tolstring(L, -2, &kl);
        v = lua_tolstring(L, -1, &vl);
        for (i = 0; i < kl; i++)
            if ((k[i] >= 'A' && k[i] <= 'Z') || k[i] == ':' || k[i] == '\n') fz_fail("header name '%s'", k);
        if (kl > 0 && (k[0] == ' ' || k[0] == '\t')) fz_fail("a header name starts with a blank");
        if (memchr(v, '\n', vl) != NULL) fz_fail("a header value holds a line break");
        if (vl > 0 && (v[0] == ' ' || v[0] == '\t')) fz_fail("a header value starts with a blank");
        /* trimmed at the end too, but for the ", " that joins an empty repeat */
        if (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t') && !(vl >= 2 && v[vl - 2] == ',' && v[vl - 1] == ' '))
            fz_fail("a header value ends with a blank");
        lua_pop(L, 1);
    }
}

static void mode_response(lua_State *L, int flags, const uint8_t *data, size_t size) {
    mc_http_req *r = (mc_http_req *)calloc(1, sizeof *r);
    mc_http_buf exact = { NULL, 0, 0 };
    size_t pos = 0;
    if (r == NULL) return;
    r->state = MC_HTTP_ACTIVE;
    r->head_ref = (flags & 2) ? 1 : LUA_NOREF;   /* only compared with LUA_NOREF: no multi, nothing queued */
    while (pos <= size) {
        const uint8_t *nl = (const uint8_t *)memchr(data + pos, '\n', size - pos);
        size_t n = nl != NULL ? (size_t)(nl - (data + pos)) + 1 : size - pos, got;
        char *line = (char *)malloc(n ? n : 1);
        if (line == NULL) break;
        if (n > 0) memcpy(line, data + pos, n);
        got = (flags & 4) ? mc_http_on_header(line, n, 1, r) : mc_http_on_header(line, 1, n, r);
        free(line);
        if (got != n && r->fail_code == NULL) fz_fail("the header callback refused a line without failing");
        if (r->status < 0 || r->status > 9999) fz_fail("status %ld", r->status);
        if (r->head.len > MC_HTTP_MAX_HEAD) fz_fail("the head grew past its limit");
        if (got != n) break;
        pos += n;
        if (n == 0) break;
    }
    exact.len = exact.cap = r->head.len;
    exact.p = (char *)malloc(exact.len ? exact.len : 1);
    if (exact.p != NULL) {
        if (exact.len > 0) memcpy(exact.p, r->head.p, exact.len);
        lua_pushcfunction(L, push_head);
        lua_pushlightuserdata(L, &exact);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("mc_http_push_headers raised: %s", fz_describe(L, -1));
        check_table(L, lua_gettop(L));
        free(exact.p);
    }
    /* the trailers (lines after the head's blank line) make a table by the same rules */
    exact.len = exact.cap = r->trail.len;
    exact.p = r->trail.len > 0 ? (char *)malloc(exact.len) : NULL;
    if (exact.p != NULL) {
        memcpy(exact.p, r->trail.p, exact.len);
        lua_pushcfunction(L, push_head);
        lua_pushlightuserdata(L, &exact);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("mc_http_push_headers raised on trailers: %s", fz_describe(L, -1));
        check_table(L, lua_gettop(L));
        free(exact.p);
    }
    mc_buf_free(&r->head);
    mc_buf_free(&r->trail);
    free(r);
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------ mode 1 */

#include "fuzz_input.h"

static void push_text(lua_State *L, input *in, int limit) {
    static const char *const words[] = { "Content-Type", "content-type", "X-A", "Accept", "a b", "", "Host", "X" };
    int b = next(in);
    if (b < 0) { lua_pushliteral(L, "x"); return; }
    if (b < 128) { lua_pushstring(L, words[b % 8]); return; }
    {
        size_t n = (size_t)(b % (limit + 1)), i;
        char buf[64];
        for (i = 0; i < n; i++) {
            int c = next(in);
            buf[i] = (char)(c < 0 ? 'a' : c);
        }
        lua_pushlstring(L, buf, n);
    }
}

static void push_headers(lua_State *L, input *in) {
    int b;
    lua_Integer idx = 1;
    lua_newtable(L);
    while ((b = next(in)) >= 0) {
        switch (b % 8) {
        case 0: case 1: case 2:   /* name = value */
            push_text(L, in, 24);
            push_text(L, in, 40);
            lua_rawset(L, -3);
            break;
        case 3: case 4: {         /* a "Name: value" line */
            luaL_Buffer lb;
            luaL_buffinit(L, &lb);
            push_text(L, in, 16);
            luaL_addvalue(&lb);
            luaL_addstring(&lb, (b & 8) ? ";" : ": ");
            push_text(L, in, 40);
            luaL_addvalue(&lb);
            luaL_pushresult(&lb);
            lua_rawseti(L, -2, idx++);
            break;
        }
        case 5:                   /* a raw line */
            push_text(L, in, 40);
            lua_rawseti(L, -2, idx++);
            break;
        case 6:                   /* keys of other types */
            if (b & 8) lua_pushboolean(L, 1);
            else lua_pushnumber(L, 1.5);
            lua_pushliteral(L, "v");
            lua_rawset(L, -3);
            break;
        default:                  /* a value that is not a string */
            push_text(L, in, 8);
            lua_pushinteger(L, 7);
            lua_rawset(L, -3);
            break;
        }
    }
}

static int check_and_build(lua_State *L) {
    mc_http_req *r = (mc_http_req *)lua_touserdata(L, 2);
    int has_ctype = mc_http_check_headers(L, 1);
    mc_http_build_headers(L, r, 1);
    lua_pushboolean(L, has_ctype);
    return 1;
}

static void mode_request(lua_State *L, const uint8_t *data, size_t size) {
    input in = { data, size };
    mc_http_req r;
    struct curl_slist *l;
    lua_Integer entries = 0, lines = 0;
    int has_ctype, saw_ctype = 0, t;
    memset(&r, 0, sizeof r);
    push_headers(L, &in);
    t = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, t) != 0) { entries++; lua_pop(L, 1); }
    lua_pushcfunction(L, check_and_build);
    lua_pushvalue(L, t);
    lua_pushlightuserdata(L, &r);
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
        if (!fz_is_coded(L, -1, "INVALID_INPUT")) fz_fail("the header check raised: %s", fz_describe(L, -1));
        if (r.hlist != NULL) fz_fail("headers were built for a table that was refused");
        return;
    }
    has_ctype = lua_toboolean(L, -1);
    for (l = r.hlist; l != NULL; l = l->next) {
        const char *s = l->data, *sep = s;
        lines++;
        if (strchr(s, '\r') != NULL || strchr(s, '\n') != NULL) fz_fail("a header line holds CR or LF");
        while (*sep != '\0' && *sep != ':' && *sep != ';') sep++;
        if (*sep == '\0' || !mc_http_is_token(s, (size_t)(sep - s))) fz_fail("header line '%s'", s);
        if (mc_http_ieq(s, (size_t)(sep - s), "content-type")) saw_ctype = 1;
    }
    curl_slist_free_all(r.hlist);
    if (lines != entries) fz_fail("%lld header lines for %lld entries", (long long)lines, (long long)entries);
    if (has_ctype != saw_ctype) fz_fail("Content-Type %s but the lines say otherwise", has_ctype ? "seen" : "not seen");
}

/* }------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    if (size == 0) return 0;
    if (data[0] & 1) mode_request(L, data + 1, size - 1);
    else mode_response(L, data[0], data + 1, size - 1);
    fz_end(L);
    return 0;
}
