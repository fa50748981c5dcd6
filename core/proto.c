/*
** proto.c: core.proto, protocol buffers for the gRPC services the providers speak, through
** protobuf-c.
**
** The messages come from the project's own .proto files (proto/), compiled by protoc-c into
** descriptors at build time; this piece walks those descriptors to turn a Lua table into a
** message and back, so there is no hand-written codec and no per-message C:
**
**   core.proto.encode(method, 'request' or 'response', value) --> bytes
**   core.proto.decode(method, 'request' or 'response', bytes) --> value, or nil, err
**   core.proto.methods() --> { '/modal.client.ModalClient/SandboxCreate', ... }
**
** `method` is a gRPC path, '/<package>.<Service>/<Method>', which names the message. A value is
** a table by the fields' names: integers (enums as their numbers), numbers, booleans, strings
** (`string` fields are UTF-8 without NUL bytes; `bytes` fields any bytes), tables for messages,
** lists for repeated fields, and a table of string keys for a map. encode raises INVALID_INPUT
** for a field of the wrong type, a name the message does not have, or nesting deeper than
** MC_PROTO_MAX_DEPTH; decode answers nil and an INVALID_OUTPUT error for bytes that are not the
** message. A decoded value has every plain field (proto3: absent means its zero), a message field
** only when it was sent, and of a oneof only the member that was sent.
**
** Memory: a message being built or read hangs from a userdata made first (its __gc frees it
** with protobuf-c's own free), so a raise at any point leaks nothing.
*/
#include "mc.h"
#include <float.h>
#include <math.h>
#include <protobuf-c/protobuf-c.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "modal/api.pb-c.c"
#include "modal/task_command_router.pb-c.c"
#pragma GCC diagnostic pop

#define MC_PROTO_HOLD_MT "mayura.proto_hold"
#define MC_PROTO_MAX_DEPTH 32

static const ProtobufCServiceDescriptor *const mc_proto_services[] = {
    &modal__client__modal_client__descriptor,
    &modal__task_command_router__task_command_router__descriptor,
};

typedef struct mc_proto_hold {
    ProtobufCMessage *msg;
} mc_proto_hold;

static int mc_proto_hold_gc(lua_State *L) {
    mc_proto_hold *h = (mc_proto_hold *)lua_touserdata(L, 1);
    if (h != NULL && h->msg != NULL) {
        protobuf_c_message_free_unpacked(h->msg, NULL);
        h->msg = NULL;
    }
    return 0;
}

static const mc_class mc_proto_hold_class = { MC_PROTO_HOLD_MT, sizeof(mc_proto_hold), mc_proto_hold_gc, NULL, NULL,
                                              NULL };

static mc_proto_hold *mc_proto_new_hold(lua_State *L) {
    return (mc_proto_hold *)mc_handle_new(L, &mc_proto_hold_class);
}

/* The input or output message of the method at index idx, with the direction at idx + 1. */
static const ProtobufCMessageDescriptor *mc_proto_message(lua_State *L, int idx) {
    size_t len, i, j;
    const char *path = lua_tolstring(L, idx, &len);
    const char *dir = lua_tostring(L, idx + 1);
    const char *slash;
    int request;
    if (lua_type(L, idx) != LUA_TSTRING || len < 4 || path[0] != '/')
        mc_raise(L, "INVALID_INPUT", "a method is a string '/<package>.<Service>/<Method>'");
    if (lua_type(L, idx + 1) != LUA_TSTRING || (strcmp(dir, "request") != 0 && strcmp(dir, "response") != 0))
        mc_raise(L, "INVALID_INPUT", "the direction must be 'request' or 'response'");
    request = strcmp(dir, "request") == 0;
    slash = (const char *)memchr(path + 1, '/', len - 1);
    if (slash != NULL) {
        size_t svc_len = (size_t)(slash - path - 1);
        for (i = 0; i < sizeof mc_proto_services / sizeof mc_proto_services[0]; i++) {
            const ProtobufCServiceDescriptor *s = mc_proto_services[i];
            if (strlen(s->name) != svc_len || memcmp(s->name, path + 1, svc_len) != 0) continue;
            for (j = 0; j < s->n_methods; j++) {
                if (strcmp(s->methods[j].name, slash + 1) == 0 && strlen(slash + 1) == len - svc_len - 2)
                    return request ? s->methods[j].input : s->methods[j].output;
            }
        }
    }
    mc_raise(L, "INVALID_INPUT", "no such method: %s", path);
    return NULL;
}

/* {======================================================
** Lua to message
** =======================================================*/

static void mc_proto_fill(lua_State *L, int idx, ProtobufCMessage *msg, int depth);

/* Whether f is a map's repeated entry: a nested message with just key (1) and value (2). */
static int mc_proto_is_map(const ProtobufCFieldDescriptor *f) {
    const ProtobufCMessageDescriptor *d;
    size_t n;
    if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label != PROTOBUF_C_LABEL_REPEATED) return 0;
    d = (const ProtobufCMessageDescriptor *)f->descriptor;
    n = strlen(d->name);
    return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
           strcmp(d->fields[0].name, "key") == 0 && d->fields[0].id == 1 &&
           strcmp(d->fields[1].name, "value") == 0 && d->fields[1].id == 2;
}

static size_t mc_proto_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    }
    return 0;
}

static lua_Integer mc_proto_int(lua_State *L, int idx, const ProtobufCFieldDescriptor *f, lua_Integer lo,
                                lua_Integer hi) {
    lua_Integer v = 0;
    int ok = 0;
    if (lua_type(L, idx) == LUA_TNUMBER) {
#if LUA_VERSION_NUM >= 503
        v = lua_tointegerx(L, idx, &ok);
#else
        lua_Number n = lua_tonumber(L, idx);
        if (n >= -9.2e18 && n <= 9.2e18) { /* in range before the cast: no UB, NaN fails here */
            v = (lua_Integer)n;
            ok = (lua_Number)v == n;
        }
#endif
    }
    if (!ok || v < lo || v > hi) mc_raise(L, "INVALID_INPUT", "field '%s' must be an integer in range", f->name);
    return v;
}

/* Writes the value at idx into the slot p of field f. */
static void mc_proto_set(lua_State *L, int idx, const ProtobufCFieldDescriptor *f, void *p, int depth) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        *(int32_t *)p = (int32_t)mc_proto_int(L, idx, f, INT32_MIN, INT32_MAX);
        break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)p = (uint32_t)mc_proto_int(L, idx, f, 0, UINT32_MAX);
        break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)p = (int64_t)mc_proto_int(L, idx, f, LLONG_MIN, LLONG_MAX);
        break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)p = (uint64_t)mc_proto_int(L, idx, f, 0, LLONG_MAX);
        break;
    case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE:
        if (lua_type(L, idx) != LUA_TNUMBER) mc_raise(L, "INVALID_INPUT", "field '%s' must be a number", f->name);
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            lua_Number x = lua_tonumber(L, idx);
            if (x == x && (x > FLT_MAX || x < -FLT_MAX) && x != HUGE_VAL && x != -HUGE_VAL)
                mc_raise(L, "INVALID_INPUT", "field '%s' is out of a float's range", f->name);
            *(float *)p = (float)x;
        } else {
            *(double *)p = (double)lua_tonumber(L, idx);
        }
        break;
    case PROTOBUF_C_TYPE_BOOL:
        if (lua_type(L, idx) != LUA_TBOOLEAN) mc_raise(L, "INVALID_INPUT", "field '%s' must be a boolean", f->name);
        *(protobuf_c_boolean *)p = lua_toboolean(L, idx) ? 1 : 0;
        break;
    case PROTOBUF_C_TYPE_STRING: {
        size_t n;
        const char *s;
        char *c;
        if (lua_type(L, idx) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "field '%s' must be a string", f->name);
        s = lua_tolstring(L, idx, &n);
        if (strlen(s) != n) mc_raise(L, "INVALID_INPUT", "field '%s' holds a NUL byte", f->name);
        if ((c = (char *)malloc(n + 1)) == NULL) mc_raise_oom(L);
        memcpy(c, s, n + 1);
        *(char **)p = c;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        size_t n;
        const char *s;
        ProtobufCBinaryData *b = (ProtobufCBinaryData *)p;
        if (lua_type(L, idx) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "field '%s' must be a string", f->name);
        s = lua_tolstring(L, idx, &n);
        if ((b->data = (uint8_t *)malloc(n > 0 ? n : 1)) == NULL) { b->len = 0; mc_raise_oom(L); }
        memcpy(b->data, s, n);
        b->len = n;
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *d = (const ProtobufCMessageDescriptor *)f->descriptor;
        ProtobufCMessage *sub;
        if (!lua_istable(L, idx)) mc_raise(L, "INVALID_INPUT", "field '%s' must be a table", f->name);
        if ((sub = (ProtobufCMessage *)calloc(1, d->sizeof_message)) == NULL) mc_raise_oom(L);
        protobuf_c_message_init(d, sub);
        *(ProtobufCMessage **)p = sub;   /* owned by the parent from here on */
        mc_proto_fill(L, idx, sub, depth + 1);
        break;
    }
    }
}

/* A repeated field (or a map) from the table at idx. */
static void mc_proto_set_repeated(lua_State *L, int idx, const ProtobufCFieldDescriptor *f, ProtobufCMessage *msg,
                                  int depth) {
    size_t *count = (size_t *)((char *)msg + f->quantifier_offset);
    void **arr = (void **)((char *)msg + f->offset);
    size_t n = 0, esz = mc_proto_size(f->type);
    int is_map = mc_proto_is_map(f);
    if (!lua_istable(L, idx)) mc_raise(L, "INVALID_INPUT", "field '%s' must be a table", f->name);
    if (is_map) {
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) { n++; lua_pop(L, 1); }
    } else {
        /* a list: keys 1..n and nothing else (a hole's length differs between Luas) */
        size_t pairs = 0;
        n = (size_t)lua_rawlen(L, idx);
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) { pairs++; lua_pop(L, 1); }
        if (pairs != n) mc_raise(L, "INVALID_INPUT", "field '%s' must be a list", f->name);
    }
    if (n == 0) return;
    if (n > 16 * 1024 * 1024) mc_raise(L, "INVALID_INPUT", "field '%s' has too many items", f->name);
    if ((*arr = calloc(n, esz)) == NULL) mc_raise_oom(L);
    if (is_map) {
        const ProtobufCMessageDescriptor *d = (const ProtobufCMessageDescriptor *)f->descriptor;
        size_t i = 0;
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) {
            ProtobufCMessage *e;
            int top = lua_gettop(L);
            if (i >= n) mc_raise(L, "INVALID_INPUT", "field '%s' changed while it was read", f->name);
            if ((e = (ProtobufCMessage *)calloc(1, d->sizeof_message)) == NULL) mc_raise_oom(L);
            protobuf_c_message_init(d, e);
            ((ProtobufCMessage **)*arr)[i++] = e;
            *count = i;
            mc_proto_set(L, top - 1, &d->fields[0], (char *)e + d->fields[0].offset, depth);
            mc_proto_set(L, top, &d->fields[1], (char *)e + d->fields[1].offset, depth);
            lua_pop(L, 1);
        }
    } else {
        size_t i;
        for (i = 0; i < n; i++) {
            lua_rawgeti(L, idx, (lua_Integer)(i + 1));
            if (lua_isnil(L, -1)) mc_raise(L, "INVALID_INPUT", "field '%s' must be a list", f->name);
            *count = i + 1;   /* counted first: a zeroed slot is freed alike, and what it gets is owned */
            mc_proto_set(L, lua_gettop(L), f, (char *)*arr + i * esz, depth);
            lua_pop(L, 1);
        }
    }
}

/* Fills msg from the table at idx. */
static void mc_proto_fill(lua_State *L, int idx, ProtobufCMessage *msg, int depth) {
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    unsigned i;
    if (depth > MC_PROTO_MAX_DEPTH) mc_raise(L, "INVALID_INPUT", "the value nests too deeply");
    luaL_checkstack(L, 8, "proto");
    /* every key must be a field */
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING || protobuf_c_message_descriptor_get_field_by_name(d, lua_tostring(L, -1)) == NULL)
            mc_raise(L, "INVALID_INPUT", "%s has no field %s", d->name,
                     lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "of that key");
    }
    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        int top;
        lua_getfield(L, idx, f->name);
        top = lua_gettop(L);
        if (lua_isnil(L, top)) { lua_pop(L, 1); continue; }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            mc_proto_set_repeated(L, top, f, msg, depth);
        } else {
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                uint32_t *c = (uint32_t *)((char *)msg + f->quantifier_offset);
                if (*c != 0) mc_raise(L, "INVALID_INPUT", "%s: two members of one oneof are set", d->name);
                /* the slot is shared: cleared, then this member's (so that what it gets is freed) */
                memset((char *)msg + f->offset, 0, mc_proto_size(f->type));
                *c = f->id;
                mc_proto_set(L, top, f, (char *)msg + f->offset, depth);
            } else {
                mc_proto_set(L, top, f, (char *)msg + f->offset, depth);
                if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset != 0 &&
                    f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING)
                    *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = 1;
            }
        }
        lua_settop(L, top - 1);
    }
}

static int l_proto_encode(lua_State *L) {
    const ProtobufCMessageDescriptor *d = mc_proto_message(L, 1);
    mc_proto_hold *h;
    size_t n;
    uint8_t *out;
    if (lua_isnoneornil(L, 3)) { lua_settop(L, 2); lua_newtable(L); }
    if (!lua_istable(L, 3)) mc_raise(L, "INVALID_INPUT", "the value must be a table");
    lua_settop(L, 3);
    h = mc_proto_new_hold(L); /* 4 */
    if ((h->msg = (ProtobufCMessage *)calloc(1, d->sizeof_message)) == NULL) mc_raise_oom(L);
    protobuf_c_message_init(d, h->msg);
    mc_proto_fill(L, 3, h->msg, 0);
    n = protobuf_c_message_get_packed_size(h->msg);
    out = (uint8_t *)lua_newuserdatauv(L, n > 0 ? n : 1, 0);
    if (protobuf_c_message_pack(h->msg, out) != n) mc_raise(L, "INTERNAL", "protobuf-c packed a wrong size");
    lua_pushlstring(L, (const char *)out, n);
    protobuf_c_message_free_unpacked(h->msg, NULL);
    h->msg = NULL;
    return 1;
}

/* }====================================================== */

/* {======================================================
** Message to Lua
** =======================================================*/

static void mc_proto_push_msg(lua_State *L, const ProtobufCMessage *msg, int depth);

static void mc_proto_push_u64(lua_State *L, uint64_t v) {
    if (v > (uint64_t)LLONG_MAX) lua_pushnumber(L, (lua_Number)v);
    else lua_pushinteger(L, (lua_Integer)v);
}

static void mc_proto_push(lua_State *L, const ProtobufCFieldDescriptor *f, const void *p, int depth) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        lua_pushinteger(L, (lua_Integer)*(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        lua_pushinteger(L, (lua_Integer)*(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        lua_pushinteger(L, (lua_Integer)*(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        mc_proto_push_u64(L, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT: lua_pushnumber(L, (lua_Number)*(const float *)p); break;
    case PROTOBUF_C_TYPE_DOUBLE: lua_pushnumber(L, (lua_Number)*(const double *)p); break;
    case PROTOBUF_C_TYPE_BOOL: lua_pushboolean(L, *(const protobuf_c_boolean *)p ? 1 : 0); break;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        lua_pushstring(L, s != NULL ? s : "");
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = (const ProtobufCBinaryData *)p;
        lua_pushlstring(L, b->len > 0 ? (const char *)b->data : "", b->len);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
        mc_proto_push_msg(L, *(ProtobufCMessage *const *)p, depth + 1);
        break;
    }
}

static void mc_proto_push_msg(lua_State *L, const ProtobufCMessage *msg, int depth) {
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    unsigned i;
    if (depth > MC_PROTO_MAX_DEPTH) { lua_pushnil(L); return; }
    luaL_checkstack(L, 8, "proto");
    lua_createtable(L, 0, (int)d->n_fields);
    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *p = (const char *)msg + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)msg + f->quantifier_offset), j;
            const char *arr = *(char *const *)p;
            size_t esz = mc_proto_size(f->type);
            if (mc_proto_is_map(f)) {
                const ProtobufCMessageDescriptor *e = (const ProtobufCMessageDescriptor *)f->descriptor;
                lua_createtable(L, 0, (int)(n < 1024 ? n : 1024));
                for (j = 0; j < n; j++) {
                    const ProtobufCMessage *m = ((ProtobufCMessage *const *)arr)[j];
                    mc_proto_push(L, &e->fields[0], (const char *)m + e->fields[0].offset, depth);
                    mc_proto_push(L, &e->fields[1], (const char *)m + e->fields[1].offset, depth);
                    lua_rawset(L, -3);
                }
            } else {
                lua_createtable(L, (int)(n < 1024 ? n : 1024), 0);
                for (j = 0; j < n; j++) {
                    mc_proto_push(L, f, arr + j * esz, depth);
                    lua_rawseti(L, -2, (lua_Integer)(j + 1));
                }
            }
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)((const char *)msg + f->quantifier_offset) != f->id) continue;
            mc_proto_push(L, f, p, depth);
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (*(ProtobufCMessage *const *)p == NULL) continue;
            mc_proto_push(L, f, p, depth);
        } else {
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset != 0 && f->type != PROTOBUF_C_TYPE_STRING &&
                !*(const protobuf_c_boolean *)((const char *)msg + f->quantifier_offset))
                continue;
            mc_proto_push(L, f, p, depth);
        }
        lua_setfield(L, -2, f->name);
    }
}

static int l_proto_decode(lua_State *L) {
    const ProtobufCMessageDescriptor *d = mc_proto_message(L, 1);
    size_t n;
    const char *s;
    mc_proto_hold *h;
    if (lua_type(L, 3) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "decode takes the message's bytes as a string");
    s = lua_tolstring(L, 3, &n);
    lua_settop(L, 3);
    h = mc_proto_new_hold(L);
    h->msg = protobuf_c_message_unpack(d, NULL, n, (const uint8_t *)s);
    if (h->msg == NULL) {
        lua_pushnil(L);
        mc_push_error(L, "INVALID_OUTPUT", "the bytes are not a %s", d->name);
        return 2;
    }
    mc_proto_push_msg(L, h->msg, 0);
    protobuf_c_message_free_unpacked(h->msg, NULL);
    h->msg = NULL;
    return 1;
}

static int l_proto_methods(lua_State *L) {
    size_t i, j;
    lua_Integer k = 0;
    lua_newtable(L);
    for (i = 0; i < sizeof mc_proto_services / sizeof mc_proto_services[0]; i++) {
        const ProtobufCServiceDescriptor *s = mc_proto_services[i];
        for (j = 0; j < s->n_methods; j++) {
            lua_pushfstring(L, "/%s/%s", s->name, s->methods[j].name);
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

/* }====================================================== */

static void mc_open_proto(lua_State *L) {
    static const luaL_Reg funcs[] = {
        {"encode", l_proto_encode},
        {"decode", l_proto_decode},
        {"methods", l_proto_methods},
        {NULL, NULL}
    };
    mc_class_register(L, &mc_proto_hold_class);
    lua_newtable(L);
    luaL_setfuncs(L, funcs, 0);
    lua_setfield(L, -2, "proto");
}
