/*
** msgpack.c: core.msgpack = { encode, decode, bin }, MessagePack over the
** system msgpack-c (4.x): its packer writes, its unpacker parses; this file
** only maps values between it and Lua, with the conventions of core.json:
**
**   decode: nil -> core.json.null; arrays and maps -> tables with
**           core.json.array_mt / object_mt; str and bin -> Lua strings;
**           integers -> integers (LuaJIT: numbers, refused beyond +-2^53);
**           floats -> numbers. Ext types, keys that are nil, NaN, tables
**           or that repeat, trailing bytes after the value, and input past
**           max_bytes are refused with nil, err (INVALID_INPUT, or
**           LIMIT_EXCEEDED for the size). Nesting is bounded by msgpack-c's
**           own stack (32 levels): deeper input is INVALID_INPUT. A pass over
**           the framing first (msgpack_scan) refuses arrays and maps that
**           declare more elements than there are bytes, before msgpack-c
**           allocates for them.
**   encode: a table with array_mt, or a non-empty sequence 1..n, is an
**           array; any other table a map (keys strings, numbers, booleans);
**           core.json.null and nil are nil; strings are str, and
**           core.msgpack.bin(s) marks a string to go as bin. Integral
**           numbers are integers, the rest float 64. Cycles and nesting past
**           MSGPACK_MAX_DEPTH raise INVALID_INPUT.
**
** Memory from msgpack-c (the packer's buffer, the unpacker's zone) lives in
** a userdata box whose __gc frees it, so a Lua error half-way cannot leak.
*/
#include "mc.h"
#include <math.h>
#include <msgpack.h>

#define MSGPACK_BOX_MT "mayura.msgpack.box"
#define MSGPACK_BIN_MT "mayura.msgpack.bin"
#define MSGPACK_MAX_DEPTH 200
#define MSGPACK_DEFAULT_MAX ((lua_Integer)64 * 1024 * 1024)
/* Upvalues of encode and decode: core.json's array and object metatables, and bin's. */
#define MSGPACK_UV_ARRAY_MT lua_upvalueindex(1)
#define MSGPACK_UV_OBJECT_MT lua_upvalueindex(2)
#define MSGPACK_UV_BIN_MT lua_upvalueindex(3)

typedef struct {
    msgpack_sbuffer buf;   /* encode's output */
    msgpack_unpacked res;  /* decode's zone */
    int has_buf, has_res;
} msgpack_box;

static int l_msgpack_box_gc(lua_State *L) {
    msgpack_box *b = (msgpack_box *)luaL_checkudata(L, 1, MSGPACK_BOX_MT);
    if (b->has_buf) msgpack_sbuffer_destroy(&b->buf);
    if (b->has_res) msgpack_unpacked_destroy(&b->res);
    b->has_buf = b->has_res = 0;
    return 0;
}

static const mc_class msgpack_box_class = { MSGPACK_BOX_MT, sizeof(msgpack_box), l_msgpack_box_gc, NULL, NULL, NULL };

static msgpack_box *msgpack_new_box(lua_State *L) {
    return (msgpack_box *)mc_handle_new(L, &msgpack_box_class);
}

/* {======================================================
** encode
** =======================================================*/

/* The packer's write callback: msgpack_sbuffer_write returns -1 when realloc fails. */
static int msgpack_fail_oom(lua_State *L, int rc) {
    if (rc != 0) mc_raise_oom(L);
    return 0;
}

/* Is the table at idx a sequence 1..n with n > 0 and no other key? Sets *n. */
static int msgpack_is_sequence(lua_State *L, int idx, size_t *n) {
    size_t count = 0, max = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TNUMBER || !lua_isinteger(L, -1)) {
            lua_pop(L, 1);
            return 0;
        }
        {
            lua_Integer k = lua_tointeger(L, -1);
            if (k < 1) {
                lua_pop(L, 1);
                return 0;
            }
            if ((size_t)k > max) max = (size_t)k;
        }
        count++;
    }
    *n = count;
    return count > 0 && count == max;
}

static void msgpack_encode_value(lua_State *L, msgpack_packer *pk, int idx, int depth);

static void msgpack_encode_number(lua_State *L, msgpack_packer *pk, int idx) {
    if (lua_isinteger(L, idx)) {
        msgpack_fail_oom(L, msgpack_pack_int64(pk, (int64_t)lua_tointeger(L, idx)));
        return;
    }
    {
        double d = (double)lua_tonumber(L, idx);
        if (isfinite(d) && d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0)
            msgpack_fail_oom(L, msgpack_pack_int64(pk, (int64_t)d));
        else
            msgpack_fail_oom(L, msgpack_pack_double(pk, d));
    }
}

static void msgpack_encode_table(lua_State *L, msgpack_packer *pk, int idx, int depth) {
    size_t n = 0, i;
    int as_array;
    if (depth > MSGPACK_MAX_DEPTH)
        mc_raise(L, "INVALID_INPUT", "msgpack.encode: nested deeper than %d (or a cycle)", MSGPACK_MAX_DEPTH);
    luaL_checkstack(L, 6, "msgpack.encode");
    if (lua_getmetatable(L, idx)) {
        if (lua_rawequal(L, -1, MSGPACK_UV_BIN_MT)) {
            size_t len;
            const char *s;
            lua_pop(L, 1);
            lua_rawgeti(L, idx, 1);
            if (lua_type(L, -1) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "msgpack.encode: a bin without its string");
            s = lua_tolstring(L, -1, &len);
            if (len > 0xffffffffu) mc_raise(L, "INVALID_INPUT", "msgpack.encode: a bin past 4 GiB");
            msgpack_fail_oom(L, msgpack_pack_bin(pk, len));
            msgpack_fail_oom(L, msgpack_pack_bin_body(pk, s, len));
            lua_pop(L, 1);
            return;
        }
        as_array = lua_rawequal(L, -1, MSGPACK_UV_ARRAY_MT) ? 1 : lua_rawequal(L, -1, MSGPACK_UV_OBJECT_MT) ? 0 : -1;
        lua_pop(L, 1);
    } else {
        as_array = -1;
    }
    if (as_array == 1) {
        n = (size_t)lua_rawlen(L, idx);
    } else {
        int seq = msgpack_is_sequence(L, idx, &n);
        if (as_array == -1) as_array = seq;
    }
    if (n > 0xffffffffu) mc_raise(L, "INVALID_INPUT", "msgpack.encode: a table too large");
    if (as_array) {
        msgpack_fail_oom(L, msgpack_pack_array(pk, n));
        for (i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, (lua_Integer)i);
            msgpack_encode_value(L, pk, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
        }
        return;
    }
    if (n == 0) { /* a table with object_mt was not counted */
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) {
            lua_pop(L, 1);
            n++;
        }
    }
    msgpack_fail_oom(L, msgpack_pack_map(pk, n));
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int kt = lua_type(L, -2);
        if (kt != LUA_TSTRING && kt != LUA_TNUMBER && kt != LUA_TBOOLEAN)
            mc_raise(L, "INVALID_INPUT", "msgpack.encode: a map key of type %s", luaL_typename(L, -2));
        msgpack_encode_value(L, pk, lua_gettop(L) - 1, depth + 1);
        msgpack_encode_value(L, pk, lua_gettop(L), depth + 1);
        lua_pop(L, 1);
    }
}

static void msgpack_encode_value(lua_State *L, msgpack_packer *pk, int idx, int depth) {
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        msgpack_fail_oom(L, msgpack_pack_nil(pk));
        return;
    case LUA_TBOOLEAN:
        msgpack_fail_oom(L, lua_toboolean(L, idx) ? msgpack_pack_true(pk) : msgpack_pack_false(pk));
        return;
    case LUA_TNUMBER:
        msgpack_encode_number(L, pk, idx);
        return;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        if (len > 0xffffffffu) mc_raise(L, "INVALID_INPUT", "msgpack.encode: a string past 4 GiB");
        msgpack_fail_oom(L, msgpack_pack_str(pk, len));
        msgpack_fail_oom(L, msgpack_pack_str_body(pk, s, len));
        return;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL) {
            msgpack_fail_oom(L, msgpack_pack_nil(pk));
            return;
        }
        break;
    case LUA_TTABLE:
        msgpack_encode_table(L, pk, idx, depth);
        return;
    default:
        break;
    }
    mc_raise(L, "INVALID_INPUT", "msgpack.encode: cannot encode a %s", luaL_typename(L, idx));
}

/* core.msgpack.encode(value) -> string */
static int l_msgpack_encode(lua_State *L) {
    msgpack_box *b;
    msgpack_packer pk;
    lua_settop(L, 1);
    b = msgpack_new_box(L);
    msgpack_sbuffer_init(&b->buf);
    b->has_buf = 1;
    msgpack_packer_init(&pk, &b->buf, msgpack_sbuffer_write);
    msgpack_encode_value(L, &pk, 1, 0);
    lua_pushlstring(L, b->buf.data != NULL ? b->buf.data : "", b->buf.size);
    msgpack_sbuffer_destroy(&b->buf);
    b->has_buf = 0;
    return 1;
}

/* core.msgpack.bin(s) -> a marker that encode writes as bin */
static int l_msgpack_bin(lua_State *L) {
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "msgpack.bin: expected a string, got %s", luaL_typename(L, 1));
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, MSGPACK_UV_BIN_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* }====================================================== */

/* {======================================================
** decode
** =======================================================*/

static uint64_t msgpack_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* A pass over the framing before msgpack-c sees the input: one whole value, and no array or
** map declaring more elements than there are bytes left (msgpack-c allocates for the declared
** count first: 8 bytes of input could ask it for 128 GiB). Returns NULL or what is wrong. */
static const char *msgpack_scan(const unsigned char *s, size_t len) {
    size_t pos = 0;
    uint64_t need = 1; /* values still to read */
    while (need > 0) {
        unsigned char b;
        uint64_t skip = 0, more = 0;
        int n;
        if (pos >= len) return "cut short";
        b = s[pos++];
        need--;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            skip = 0;
        } else if (b <= 0x8f) {
            more = 2u * (b & 0x0f);
        } else if (b <= 0x9f) {
            more = b & 0x0f;
        } else if (b <= 0xbf) {
            skip = b & 0x1f;
        } else if (b == 0xc1) {
            return "a never-used type byte";
        } else if (b >= 0xc4 && b <= 0xc9) { /* bin 8/16/32, ext 8/16/32 */
            n = 1 << ((b - 0xc4) % 3);
            if (len - pos < (size_t)n) return "cut short";
            skip = msgpack_be(s + pos, n) + (b >= 0xc7 ? 1 : 0);
            pos += (size_t)n;
        } else if (b == 0xca || b == 0xcb) {
            skip = b == 0xca ? 4 : 8;
        } else if (b >= 0xcc && b <= 0xd3) {
            skip = 1u << ((b - 0xcc) % 4);
        } else if (b >= 0xd4 && b <= 0xd8) {
            skip = 1 + (1u << (b - 0xd4));
        } else if (b >= 0xd9 && b <= 0xdb) {
            n = 1 << (b - 0xd9);
            if (len - pos < (size_t)n) return "cut short";
            skip = msgpack_be(s + pos, n);
            pos += (size_t)n;
        } else { /* 0xdc..0xdf: array 16/32, map 16/32 */
            n = (b == 0xdc || b == 0xde) ? 2 : 4;
            if (len - pos < (size_t)n) return "cut short";
            more = msgpack_be(s + pos, n) * (b >= 0xde ? 2 : 1);
            pos += (size_t)n;
        }
        if (skip > len - pos) return "cut short";
        pos += (size_t)skip;
        need += more;
        if (need > len - pos) return "more elements declared than bytes left";
    }
    if (pos != len) return "bytes after the value";
    return NULL;
}

/* Pushes the Lua value of o; returns NULL, or a message for what is refused. */
static const char *msgpack_push_object(lua_State *L, const msgpack_object *o) {
    uint32_t i;
    luaL_checkstack(L, 4, "msgpack.decode");
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        lua_pushlightuserdata(L, NULL);
        return NULL;
    case MSGPACK_OBJECT_BOOLEAN:
        lua_pushboolean(L, o->via.boolean);
        return NULL;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
#if LUA_VERSION_NUM < 503
        if (o->via.u64 > (uint64_t)MC_MAX_SAFE_INT) return "an integer past 2^53";
        lua_pushnumber(L, (lua_Number)o->via.u64);
#else
        if (o->via.u64 > (uint64_t)LUA_MAXINTEGER) return "an integer past 2^63 - 1";
        lua_pushinteger(L, (lua_Integer)o->via.u64);
#endif
        return NULL;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
#if LUA_VERSION_NUM < 503
        if (o->via.i64 < -MC_MAX_SAFE_INT) return "an integer past -2^53";
        lua_pushnumber(L, (lua_Number)o->via.i64);
#else
        lua_pushinteger(L, (lua_Integer)o->via.i64);
#endif
        return NULL;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        lua_pushnumber(L, (lua_Number)o->via.f64);
        return NULL;
    case MSGPACK_OBJECT_STR:
        lua_pushlstring(L, o->via.str.size > 0 ? o->via.str.ptr : "", o->via.str.size);
        return NULL;
    case MSGPACK_OBJECT_BIN:
        lua_pushlstring(L, o->via.bin.size > 0 ? o->via.bin.ptr : "", o->via.bin.size);
        return NULL;
    case MSGPACK_OBJECT_ARRAY:
        lua_createtable(L, o->via.array.size < 1024 ? (int)o->via.array.size : 1024, 0);
        for (i = 0; i < o->via.array.size; i++) {
            const char *why = msgpack_push_object(L, &o->via.array.ptr[i]);
            if (why != NULL) return why;
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_pushvalue(L, MSGPACK_UV_ARRAY_MT);
        lua_setmetatable(L, -2);
        return NULL;
    case MSGPACK_OBJECT_MAP:
        lua_createtable(L, 0, o->via.map.size < 1024 ? (int)o->via.map.size : 1024);
        for (i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            const char *why;
            if (k->type == MSGPACK_OBJECT_NIL || k->type == MSGPACK_OBJECT_ARRAY || k->type == MSGPACK_OBJECT_MAP)
                return "a map key that is nil, an array or a map";
            if ((k->type == MSGPACK_OBJECT_FLOAT32 || k->type == MSGPACK_OBJECT_FLOAT64) && isnan(k->via.f64))
                return "a map key that is NaN";
            why = msgpack_push_object(L, k);
            if (why != NULL) return why;
            lua_pushvalue(L, -1);
            lua_rawget(L, -3);
            if (!lua_isnil(L, -1)) return "a map key given twice";
            lua_pop(L, 1);
            why = msgpack_push_object(L, &o->via.map.ptr[i].val);
            if (why != NULL) return why;
            lua_rawset(L, -3);
        }
        lua_pushvalue(L, MSGPACK_UV_OBJECT_MT);
        lua_setmetatable(L, -2);
        return NULL;
    default:
        return "an ext value";
    }
}

/* core.msgpack.decode(bytes, { max_bytes }) -> value, or nil, err */
static int l_msgpack_decode(lua_State *L) {
    size_t len, off = 0;
    const char *s, *why;
    lua_Integer max = MSGPACK_DEFAULT_MAX;
    msgpack_box *b;
    msgpack_unpack_return rc;
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "msgpack.decode: expected a string, got %s", luaL_typename(L, 1));
    if (!lua_isnoneornil(L, 2)) {
        if (!lua_istable(L, 2)) return mc_raise(L, "INVALID_INPUT", "msgpack options must be a table");
        lua_getfield(L, 2, "max_bytes");
        if (!lua_isnil(L, -1)) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1)
                return mc_raise(L, "INVALID_INPUT", "msgpack.decode: max_bytes must be a positive integer");
            max = lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
    }
    s = lua_tolstring(L, 1, &len);
    if ((lua_Integer)len > max) return mc_fail(L, "LIMIT_EXCEEDED", "msgpack: %zu bytes, past max_bytes", len);
    why = msgpack_scan((const unsigned char *)s, len);
    if (why != NULL) return mc_fail(L, "INVALID_INPUT", "msgpack: %s", why);
    lua_settop(L, 1);
    b = msgpack_new_box(L);
    msgpack_unpacked_init(&b->res);
    b->has_res = 1;
    rc = msgpack_unpack_next(&b->res, s, len, &off);
    /* msgpack-c says NOMEM also for nesting past its stack (32 levels): an input error here */
    if (rc == MSGPACK_UNPACK_NOMEM_ERROR)
        return mc_fail(L, "INVALID_INPUT", "msgpack: nested deeper than 32 levels (or out of memory)");
    if (rc == MSGPACK_UNPACK_CONTINUE || (rc == MSGPACK_UNPACK_SUCCESS && off > len))
        return mc_fail(L, "INVALID_INPUT", "msgpack: cut short");
    if (rc != MSGPACK_UNPACK_SUCCESS) return mc_fail(L, "INVALID_INPUT", "msgpack: not MessagePack");
    if (off != len) return mc_fail(L, "INVALID_INPUT", "msgpack: %zu bytes after the value", len - off);
    why = msgpack_push_object(L, &b->res.data);
    if (why != NULL) return mc_fail(L, "INVALID_INPUT", "msgpack: %s", why);
    msgpack_unpacked_destroy(&b->res);
    b->has_res = 0;
    return 1;
}

/* }====================================================== */

static void mc_open_msgpack(lua_State *L) {
    static const luaL_Reg funcs[] = {
        {"encode", l_msgpack_encode},
        {"decode", l_msgpack_decode},
        {"bin", l_msgpack_bin},
        {NULL, NULL}
    };
    mc_class_register(L, &msgpack_box_class);
    lua_createtable(L, 0, 3);
    luaL_newmetatable(L, "mayura.json.array");  /* core.json's, made by mc_open_json */
    luaL_newmetatable(L, "mayura.json.object");
    luaL_newmetatable(L, MSGPACK_BIN_MT);
    luaL_setfuncs(L, funcs, 3);
    lua_setfield(L, -2, "msgpack");
}
