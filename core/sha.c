/*
** sha.c: core.sha256(data) and core.hmac_sha256(key, data), each returning the
** 32-byte digest as a string (FIPS 180-4 SHA-256; HMAC as RFC 2104 defines it).
** The specs' stand-in of AWS checks SigV4 signatures with them (libcurl signs
** the provider's requests: nothing in the library signs by hand).
*/
#include "mc.h"

typedef struct mc_sha256 {
    uint32_t h[8];
    unsigned char block[64];
    size_t fill;
    uint64_t total;
} mc_sha256;

static const uint32_t mc_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

static uint32_t mc_rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static void mc_sha256_init(mc_sha256 *s) {
    static const uint32_t h0[8] = { 0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u };
    memcpy(s->h, h0, sizeof h0);
    s->fill = 0;
    s->total = 0;
}

static void mc_sha256_block(mc_sha256 *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) |
               (uint32_t)p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = mc_rotr(w[i - 15], 7) ^ mc_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = mc_rotr(w[i - 2], 17) ^ mc_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3];
    e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (i = 0; i < 64; i++) {
        t1 = h + (mc_rotr(e, 6) ^ mc_rotr(e, 11) ^ mc_rotr(e, 25)) + ((e & f) ^ (~e & g)) + mc_sha256_k[i] + w[i];
        t2 = (mc_rotr(a, 2) ^ mc_rotr(a, 13) ^ mc_rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d;
    s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void mc_sha256_update(mc_sha256 *s, const unsigned char *p, size_t n) {
    s->total += n;
    while (n > 0) {
        size_t take = 64 - s->fill;
        if (take > n) take = n;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) {
            mc_sha256_block(s, s->block);
            s->fill = 0;
        }
    }
}

static void mc_sha256_final(mc_sha256 *s, unsigned char out[32]) {
    uint64_t bits = s->total * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    int i;
    mc_sha256_update(s, &pad, 1);
    while (s->fill != 56) mc_sha256_update(s, &zero, 1);
    for (i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    mc_sha256_update(s, len, 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

static const unsigned char *mc_sha_arg(lua_State *L, int i, const char *fn, size_t *n) {
    if (lua_type(L, i) != LUA_TSTRING)
        mc_raise(L, "INVALID_INPUT", "%s: expected a string, got %s", fn, luaL_typename(L, i));
    return (const unsigned char *)lua_tolstring(L, i, n);
}

static int l_sha256(lua_State *L) {
    size_t n;
    const unsigned char *p = mc_sha_arg(L, 1, "sha256", &n);
    mc_sha256 s;
    unsigned char out[32];
    mc_sha256_init(&s);
    mc_sha256_update(&s, p, n);
    mc_sha256_final(&s, out);
    lua_pushlstring(L, (const char *)out, 32);
    return 1;
}

static int l_hmac_sha256(lua_State *L) {
    size_t kn, n, i;
    const unsigned char *key = mc_sha_arg(L, 1, "hmac_sha256", &kn);
    const unsigned char *p = mc_sha_arg(L, 2, "hmac_sha256", &n);
    unsigned char k[64], pad[64], inner[32], out[32];
    mc_sha256 s;
    memset(k, 0, sizeof k);
    if (kn > 64) {
        mc_sha256_init(&s);
        mc_sha256_update(&s, key, kn);
        mc_sha256_final(&s, k);
    } else {
        memcpy(k, key, kn);
    }
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
    mc_sha256_init(&s);
    mc_sha256_update(&s, pad, 64);
    mc_sha256_update(&s, p, n);
    mc_sha256_final(&s, inner);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
    mc_sha256_init(&s);
    mc_sha256_update(&s, pad, 64);
    mc_sha256_update(&s, inner, 32);
    mc_sha256_final(&s, out);
    lua_pushlstring(L, (const char *)out, 32);
    return 1;
}

static void mc_open_sha(lua_State *L) {
    lua_pushcfunction(L, l_sha256);
    lua_setfield(L, -2, "sha256");
    lua_pushcfunction(L, l_hmac_sha256);
    lua_setfield(L, -2, "hmac_sha256");
}
