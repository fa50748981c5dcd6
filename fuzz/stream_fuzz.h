/*
** stream_fuzz.h: what the targets of core.stream_parser (core/stream.c)
** share: connect_fuzz, ndjson_fuzz, sse_fuzz and eventstream_fuzz each
** define FZ_KIND and a reference reading of a whole input, then include
** this (a target that defines FZ_PREPARE also gives fz_prepare(buf, n),
** which may rewrite the input before it is read).
**
** Input: byte 0 picks the limit (max_bytes: the default, or small enough
** that LIMIT_EXCEEDED is reached), byte 1 seeds the cutting, the rest is the
** stream. The stream goes through three parsers of the real module: fed at
** once, fed in pieces of random sizes (empty ones too), and fed one byte at
** a time, each ended by finish(). The three must give the same events and
** the same error (code), byte for byte; every error must be coded
** (INVALID_INPUT or LIMIT_EXCEEDED); every event must keep the kind's
** promises (fz_check_event); and when the whole input is read without an
** error at the default limit, the events must be the reference's
** (fz_reference, written independently of core/stream.c, on the whole
** buffer at once).
*/
#ifndef MAYURA_STREAM_FUZZ_H
#define MAYURA_STREAM_FUZZ_H

#include "fuzz_lua.h"

/* An outcome written as bytes: 'E' events with their fields, then 'X' code when it failed. */
typedef mc_sp_buf fz_out;

static void fz_put(fz_out *o, const void *p, size_t n) {
    if (mc_sp_add(o, (const char *)p, n) != 0) fz_fail("out of memory");
}

static void fz_put_field(fz_out *o, char tag, const char *p, size_t n) {
    uint32_t len = (uint32_t)n;
    fz_put(o, &tag, 1);
    fz_put(o, &len, sizeof len);
    fz_put(o, p, n);
}

/* One event as the module or the reference gives it. */
typedef struct {
    const char *data, *event, *id;
    size_t data_len, event_len, id_len;
    int end_stream;
} fz_event;

static void fz_put_event(fz_out *o, const fz_event *e) {
    fz_put(o, "E", 1);
    fz_put_field(o, 'd', e->data, e->data_len);
    if (e->event) fz_put_field(o, 'e', e->event, e->event_len);
    if (e->id) fz_put_field(o, 'i', e->id, e->id_len);
    if (e->end_stream) fz_put(o, "$", 1);
}

/* Defined by the target. */
static void fz_check_event(const fz_event *e, size_t max);
static int fz_reference(const uint8_t *p, size_t n, fz_out *o);

static const char *fz_str_field(lua_State *L, int t, const char *name, size_t *len) {
    const char *s;
    lua_getfield(L, t, name);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *len = 0;
        return NULL;
    }
    if (lua_type(L, -1) != LUA_TSTRING) fz_fail("event field %s is a %s", name, luaL_typename(L, -1));
    s = lua_tolstring(L, -1, len);
    lua_pop(L, 1); /* the string stays alive in the event table */
    return s;
}

/* Reads the results of a feed or finish call (events table below an optional error) into o. */
static int fz_take(lua_State *L, int nres, fz_out *o, size_t max) {
    int t = lua_gettop(L) - nres + 1;
    lua_Integer i, n;
    if (lua_type(L, t) != LUA_TTABLE) fz_fail("feed did not return an events table");
    n = (lua_Integer)lua_rawlen(L, t);
    for (i = 1; i <= n; i++) {
        fz_event e;
        int et;
        memset(&e, 0, sizeof e);
        lua_rawgeti(L, t, i);
        et = lua_gettop(L);
        if (lua_type(L, et) != LUA_TTABLE) fz_fail("event %d is not a table", (int)i);
        e.data = fz_str_field(L, et, "data", &e.data_len);
        if (e.data == NULL) fz_fail("an event without data");
        e.event = fz_str_field(L, et, "event", &e.event_len);
        e.id = fz_str_field(L, et, "id", &e.id_len);
        lua_getfield(L, et, "end_stream");
        e.end_stream = lua_toboolean(L, -1);
        lua_pop(L, 1);
        fz_check_event(&e, max);
        fz_put_event(o, &e);
        lua_pop(L, 1);
    }
    if (nres > 1 && !lua_isnil(L, t + 1)) {
        const char *code;
        if (!fz_is_coded(L, t + 1, NULL)) fz_fail("an error that is not coded: %s", fz_describe(L, t + 1));
        lua_getfield(L, t + 1, "code");
        code = lua_tostring(L, -1);
        if (strcmp(code, "INVALID_INPUT") != 0 && strcmp(code, "LIMIT_EXCEEDED") != 0)
            fz_fail("error code %s", code);
        fz_put(o, "X", 1);
        fz_put(o, code, strlen(code));
        lua_pop(L, 1);
        lua_settop(L, t - 1);
        return 1;
    }
    lua_settop(L, t - 1);
    return 0;
}

/* Calls parser:<method>(piece) with the parser at index 1; returns whether it failed. */
static int fz_call(lua_State *L, const char *method, const uint8_t *p, size_t n, fz_out *o, size_t max) {
    int base = lua_gettop(L);
    lua_getfield(L, 1, method);
    lua_pushvalue(L, 1);
    if (p != NULL) lua_pushlstring(L, (const char *)p, n);
    if (lua_pcall(L, p != NULL ? 2 : 1, LUA_MULTRET, 0) != LUA_OK) fz_fail("%s raised: %s", method, fz_describe(L, -1));
    return fz_take(L, lua_gettop(L) - base, o, max);
}

static uint32_t fz_rand(uint32_t *s) {
    uint32_t x = *s ? *s : 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    return x;
}

/* mode 0: at once; 1: random pieces; 2: one byte at a time. Returns whether it failed. */
static int fz_run(lua_State *L, int mode, lua_Integer max, uint32_t seed, const uint8_t *p, size_t n, fz_out *o) {
    size_t at = 0;
    int failed = 0;
    lua_settop(L, 0);
    fz_core_fn(L, NULL, "stream_parser");
    lua_pushstring(L, FZ_KIND);
    lua_createtable(L, 0, 1);
    lua_pushinteger(L, max);
    lua_setfield(L, -2, "max_bytes");
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) fz_fail("stream_parser raised: %s", fz_describe(L, -1));
    while (at < n && !failed) {
        size_t k = n - at;
        if (mode == 1) {
            uint32_t r = fz_rand(&seed);
            k = (r & 3) == 0 ? 0 : (size_t)(r >> 8) % 17;
            if (k > n - at) k = n - at;
        } else if (mode == 2) {
            k = 1;
        }
        failed = fz_call(L, "feed", p + at, k, o, (size_t)max);
        at += k;
    }
    if (!failed) failed = fz_call(L, "finish", NULL, 0, o, (size_t)max);
    fz_end(L);
    return failed;
}

static int fz_same(const fz_out *a, const fz_out *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    fz_out out[3], ref;
    lua_Integer max;
    uint32_t seed;
    int i, failed = 0;
    if (size < 2) return 0;
    switch (data[0] & 3) {
    case 0: max = MC_SP_DEFAULT_MAX; break;
    case 1: max = 1 + data[1] % 16; break;
    case 2: max = 1 + data[1]; break;
    default: max = 64; break;
    }
    seed = (uint32_t)data[1] * 2654435761u + (uint32_t)size;
#ifdef FZ_PREPARE
    /* a target may rewrite its input first (eventstream: fix the CRCs, so that the fuzzer reaches
    ** what follows them); the copy is what all three runs and the reference read */
    {
        static uint8_t *copy;
        static size_t copy_cap;
        if (size > copy_cap) {
            uint8_t *np = (uint8_t *)realloc(copy, size);
            if (np == NULL) fz_fail("out of memory");
            copy = np;
            copy_cap = size;
        }
        memcpy(copy, data, size);
        fz_prepare(copy, size);
        data = copy;
    }
#endif
    memset(out, 0, sizeof out);
    memset(&ref, 0, sizeof ref);
    for (i = 0; i < 3; i++) {
        int f = fz_run(L, i, max, seed, data + 2, size - 2, &out[i]);
        if (i == 0) failed = f;
        else if (f != failed) fz_fail("cutting the input changed whether it fails");
        if (!fz_same(&out[i], &out[0]))
            fz_fail("cutting the input %s changed the outcome", i == 1 ? "in pieces" : "byte by byte");
    }
    if (max == MC_SP_DEFAULT_MAX) {
        /* inputs are far below the default limit: only malformed input fails */
        int valid = fz_reference(data + 2, size - 2, &ref);
        if (valid == failed) fz_fail(valid ? "a valid stream failed" : "a malformed stream was taken");
        if (valid && !fz_same(&ref, &out[0])) fz_fail("the events differ from the reference reading");
    }
    for (i = 0; i < 3; i++) mc_buf_free(&out[i]);
    mc_buf_free(&ref);
    return 0;
}

#endif
