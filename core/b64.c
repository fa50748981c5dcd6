/*
** b64.c: core.base64 = { encode, decode }, standard base64 (RFC 4648,
** alphabet A-Z a-z 0-9 + /, '=' padding) over arbitrary bytes.
**
** encode always pads. decode is lenient only where it costs nothing:
** padding may be left out and ASCII whitespace (space, \t, \r, \n) is
** skipped, so wrapped (MIME/PEM-style) text decodes; everything else that
** is not canonical-looking base64 (a foreign character, data after '=',
** an impossible length) is refused with nil, err. Non-zero bits in the
** last, partial group are accepted (RFC 4648 section 3.5 lets decoders
** choose). Results are built in a luaL_Buffer, whose allocation failures
** raise Lua's memory error, so nothing can leak.
*/
#include "mc.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The 6-bit value of an alphabet character, or -1. */
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int b64_is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* core.base64.encode(s) -> string */
static int l_b64_encode(lua_State *L) {
    size_t len, i, outlen;
    const unsigned char *s;
    char *out, *o;
    luaL_Buffer b;
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "base64.encode: expected a string, got %s",
                        luaL_typename(L, 1));
    s = (const unsigned char *)lua_tolstring(L, 1, &len);
    if (len / 3 >= (SIZE_MAX - 4) / 4)
        return mc_raise(L, "INVALID_INPUT", "base64.encode: input too large");
    outlen = (len + 2) / 3 * 4;
    out = o = luaL_buffinitsize(L, &b, outlen);
    for (i = 0; i + 3 <= len; i += 3) {
        unsigned long v = ((unsigned long)s[i] << 16) | ((unsigned long)s[i + 1] << 8) | s[i + 2];
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = b64_alphabet[(v >> 6) & 63];
        *o++ = b64_alphabet[v & 63];
    }
    if (len - i == 1) {
        unsigned long v = (unsigned long)s[i] << 16;
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (len - i == 2) {
        unsigned long v = ((unsigned long)s[i] << 16) | ((unsigned long)s[i + 1] << 8);
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = b64_alphabet[(v >> 6) & 63];
        *o++ = '=';
    }
    luaL_pushresultsize(&b, (size_t)(o - out));
    return 1;
}

/* core.base64.decode(s) -> string, or nil, err for input that is not base64. */
static int l_b64_decode(lua_State *L) {
    size_t len, i, ndata = 0, npad = 0;
    const unsigned char *s;
    unsigned long acc = 0;
    int nacc = 0;
    char *out, *o;
    luaL_Buffer b;
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "base64.decode: expected a string, got %s",
                        luaL_typename(L, 1));
    s = (const unsigned char *)lua_tolstring(L, 1, &len);
    /* Every 4 input characters give at most 3 bytes, so this bound is never exceeded. */
    out = o = luaL_buffinitsize(L, &b, len / 4 * 3 + 3);
    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        int v;
        if (b64_is_space(c)) continue;
        if (c == '=') {
            npad++;
            continue;
        }
        v = b64_value(c);
        if (v < 0) {
            if (c >= 0x21 && c <= 0x7e)
                return mc_fail(L, "INVALID_INPUT", "invalid base64: character '%c' at byte %zu",
                               c, i + 1);
            return mc_fail(L, "INVALID_INPUT", "invalid base64: byte 0x%02x at byte %zu", c, i + 1);
        }
        if (npad > 0)
            return mc_fail(L, "INVALID_INPUT", "invalid base64: data after padding at byte %zu", i + 1);
        ndata++;
        acc = (acc << 6) | (unsigned long)v;
        if (++nacc == 4) {
            *o++ = (char)((acc >> 16) & 0xff);
            *o++ = (char)((acc >> 8) & 0xff);
            *o++ = (char)(acc & 0xff);
            acc = 0;
            nacc = 0;
        }
    }
    /* A lone character in the last group cannot hold a whole byte. */
    if (nacc == 1)
        return mc_fail(L, "INVALID_INPUT", "invalid base64: length %zu (without padding) is not possible",
                       ndata);
    /* Padding is optional, but when present it must complete the last group exactly. */
    if (npad > 0 && (npad > 2 || nacc == 0 || (size_t)nacc + npad != 4))
        return mc_fail(L, "INVALID_INPUT", "invalid base64: wrong padding (%zu '=' after %zu characters)",
                       npad, ndata);
    if (nacc == 2) {
        *o++ = (char)((acc >> 4) & 0xff);
    } else if (nacc == 3) {
        *o++ = (char)((acc >> 10) & 0xff);
        *o++ = (char)((acc >> 2) & 0xff);
    }
    luaL_pushresultsize(&b, (size_t)(o - out));
    return 1;
}

static void mc_open_b64(lua_State *L) {
    static const luaL_Reg funcs[] = {
        {"encode", l_b64_encode},
        {"decode", l_b64_decode},
        {NULL, NULL}
    };
    luaL_newlib(L, funcs);
    lua_setfield(L, -2, "base64");
}
