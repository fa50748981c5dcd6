/*
** b64_fuzz: core.base64.decode and encode through a real lua_State.
**
**  - decode(input) agrees with a reference decoder written here from the
**    rules in core/b64.c (whitespace skipped, padding optional but exact
**    when present, nothing after it, no lone last character): same
**    acceptance, same bytes; a refusal is nil + INVALID_INPUT;
**  - encode(input) is 4 * ceil(n / 3) characters of the alphabet and '=',
**    and decodes back to the input;
**  - encode(decode(input)) decodes to the same bytes again.
*/
#include "fuzz_lua.h"

static int ref_value(unsigned char c) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = c != 0 ? strchr(abc, c) : NULL;
    return p == NULL ? -1 : (int)(p - abc);
}

/* Returns the decoded length, or -1 for input that is not base64 by the rules. */
static long ref_decode(const unsigned char *s, size_t n, unsigned char *out) {
    unsigned char *vals = (unsigned char *)malloc(n + 1);
    size_t nv = 0, npad = 0, i, o = 0;
    if (vals == NULL) abort();
    for (i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
        if (c == '=') { npad++; continue; }
        if (npad > 0 || ref_value(c) < 0) { free(vals); return -1; }
        vals[nv++] = (unsigned char)ref_value(c);
    }
    if (nv % 4 == 1 || (npad > 0 && (nv % 4 == 0 || nv % 4 + npad != 4))) { free(vals); return -1; }
    for (i = 0; i + 4 <= nv; i += 4) {
        out[o++] = (unsigned char)(vals[i] << 2 | vals[i + 1] >> 4);
        out[o++] = (unsigned char)(vals[i + 1] << 4 | vals[i + 2] >> 2);
        out[o++] = (unsigned char)(vals[i + 2] << 6 | vals[i + 3]);
    }
    if (nv - i >= 2) out[o++] = (unsigned char)(vals[i] << 2 | vals[i + 1] >> 4);
    if (nv - i == 3) out[o++] = (unsigned char)(vals[i + 1] << 4 | vals[i + 2] >> 2);
    free(vals);
    return (long)o;
}

/* Pushes the one or two results of core.base64[fn](s); the call must not raise. */
static void call(lua_State *L, const char *fn, const char *s, size_t len) {
    fz_core_fn(L, "base64", fn);
    lua_pushlstring(L, s, len);
    if (lua_pcall(L, 1, 2, 0) != LUA_OK) fz_fail("base64.%s raised: %s", fn, fz_describe(L, -1));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    unsigned char *ref = (unsigned char *)malloc(size + 4);
    long rlen;
    size_t len, i, elen;
    const char *got, *enc;

    if (ref == NULL) return 0;
    rlen = ref_decode(data, size, ref);

    call(L, "decode", (const char *)data, size);
    if (lua_isnil(L, -2)) {
        if (!fz_is_coded(L, -1, "INVALID_INPUT")) fz_fail("base64.decode failed without INVALID_INPUT");
        if (rlen >= 0) fz_fail("base64.decode refused what the reference takes: %s", fz_describe(L, -1));
    } else {
        got = lua_tolstring(L, -2, &len);
        if (got == NULL) fz_fail("base64.decode gave a %s", luaL_typename(L, -2));
        if (rlen < 0) fz_fail("base64.decode took what the reference refuses");
        if ((long)len != rlen || memcmp(got, ref, len) != 0) fz_fail("base64.decode differs from the reference");
        /* encode(decode(x)) decodes to the same bytes */
        lua_pop(L, 1);
        call(L, "encode", got, len);
        lua_pop(L, 1);
        enc = lua_tolstring(L, -1, &elen);
        call(L, "decode", enc, elen);
        {
            size_t l2;
            const char *again = lua_tolstring(L, -2, &l2);
            if (again == NULL || l2 != len || memcmp(again, got, len) != 0)
                fz_fail("decode(encode(decode(x))) differs from decode(x)");
        }
    }
    lua_settop(L, 0);

    /* the input as bytes: encode, then decode back */
    call(L, "encode", (const char *)data, size);
    enc = lua_tolstring(L, -2, &elen);
    if (enc == NULL || !lua_isnil(L, -1)) fz_fail("base64.encode gave no string");
    if (elen != (size + 2) / 3 * 4) fz_fail("base64.encode gave %zu characters for %zu bytes", elen, size);
    for (i = 0; i < elen; i++)
        if (enc[i] != '=' ? ref_value((unsigned char)enc[i]) < 0 : i + 2 < elen)
            fz_fail("base64.encode wrote '%c' at %zu", enc[i], i);
    rlen = ref_decode((const unsigned char *)enc, elen, ref);
    if (rlen != (long)size || memcmp(ref, data, size) != 0) fz_fail("the reference does not read encode's text back");
    call(L, "decode", enc, elen);
    got = lua_tolstring(L, -2, &len);
    if (got == NULL || len != size || memcmp(got, data, size) != 0) fz_fail("decode(encode(x)) differs from x");

    free(ref);
    fz_end(L);
    return 0;
}
