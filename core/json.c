/*
** json.c: core.json = { encode, decode, null, array_mt, object_mt },
** JSON over the system cJSON (1.7.x).
**
** decode: cJSON parses; a pre-scan of the text (json_scan) adds what cJSON
** does not check: the depth limit with a clear message, strict RFC 8259
** numbers and whitespace, unescaped control characters in strings and
** \u escapes with bad hex digits (cJSON reads them as NUL). \u0000 itself
** cannot live in cJSON's C strings: see json_mark_nuls.
** The tree is then turned into Lua values: null -> core.json.null, arrays
** and objects -> tables with array_mt / object_mt, integral numbers within
** +-2^53 -> integers.
**
** encode: builds a cJSON tree whose leaves are raw text we format ourselves
** (exact 64-bit integers, shortest round-tripping floats, strings escaped
** here so that NUL bytes survive), then prints it. Integral floats print
** without a fraction (3.0 -> "3"), as %g does.
**
** Both keep the cJSON tree (and encode's text and scratch buffer) in a
** userdata box whose __gc frees them, so a Lua error raised half-way (an
** invalid value, a memory error from the Lua allocator) cannot leak them.
*/
#include "mc.h"
#include <math.h>
#include <cJSON.h>

#define JSON_MAX_DEPTH 1000 /* = cJSON's CJSON_NESTING_LIMIT */
#define JSON_ARRAY_MT "mayura.json.array"
#define JSON_OBJECT_MT "mayura.json.object"
#define JSON_BOX_MT "mayura.json.box"

/* Upvalues of encode and decode. */
#define JSON_UV_ARRAY_MT lua_upvalueindex(1)
#define JSON_UV_OBJECT_MT lua_upvalueindex(2)

/* What a Lua error must not leak: freed by __gc, or by json_box_clear on success. */
typedef struct {
    cJSON *tree;
    char *text;    /* cJSON_PrintUnformatted result */
    char *scratch; /* escaped string being built (encode) */
    char *copy;    /* input rewritten by json_mark_nuls (decode) */
    size_t scratch_cap;
} json_box;

static void json_box_clear(json_box *b) {
    if (b->tree != NULL) cJSON_Delete(b->tree);
    if (b->text != NULL) cJSON_free(b->text);
    free(b->scratch);
    free(b->copy);
    b->copy = NULL;
    b->tree = NULL;
    b->text = NULL;
    b->scratch = NULL;
    b->scratch_cap = 0;
}

static int l_json_box_gc(lua_State *L) {
    json_box *b = (json_box *)luaL_checkudata(L, 1, JSON_BOX_MT);
    json_box_clear(b);
    return 0;
}

static const mc_class json_box_class = { JSON_BOX_MT, sizeof(json_box), l_json_box_gc, NULL, NULL, NULL };

static json_box *json_box_new(lua_State *L) {
    return (json_box *)mc_handle_new(L, &json_box_class);
}

static int json_oom(lua_State *L, const char *fn) {
    return mc_raise(L, MC_OOM_CODE, "json.%s: " MC_OOM_MSG, fn);
}

/* Reads the optional options table at index 2: only max_depth is known. */
static int json_opt_depth(lua_State *L, const char *fn) {
    static const char *const keys[] = {"max_depth", NULL};
    if (lua_isnoneornil(L, 2)) return JSON_MAX_DEPTH;
    if (lua_type(L, 2) != LUA_TTABLE)
        return mc_raise(L, "INVALID_INPUT", "json.%s: options must be a table, got %s", fn,
                        luaL_typename(L, 2));
    mc_check_keys(L, 2, keys);
    return (int)mc_opt_int(L, 2, "max_depth", JSON_MAX_DEPTH, 1, JSON_MAX_DEPTH);
}

/* {======================================================
** Decoding
** =======================================================*/

static int json_is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int json_is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

/*
** Matches an RFC 8259 number at s[i]; returns the index after it, or
** (size_t)-1 when the number is malformed. cJSON would take "01", "1.",
** "-.5" or "1.e3" (it hands any run of [0-9+-.eE] to strtod), so the
** grammar is checked here, including that no such character follows.
*/
static size_t json_scan_number(const unsigned char *s, size_t len, size_t i) {
    if (i < len && s[i] == '-') i++;
    if (i < len && s[i] == '0') {
        i++;
    } else if (i < len && s[i] >= '1' && s[i] <= '9') {
        while (i < len && json_is_digit(s[i])) i++;
    } else {
        return (size_t)-1;
    }
    if (i < len && s[i] == '.') {
        i++;
        if (i >= len || !json_is_digit(s[i])) return (size_t)-1;
        while (i < len && json_is_digit(s[i])) i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= len || !json_is_digit(s[i])) return (size_t)-1;
        while (i < len && json_is_digit(s[i])) i++;
    }
    if (i < len && (json_is_digit(s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                    s[i] == '+' || s[i] == '-'))
        return (size_t)-1;
    return i;
}

static int json_is_hex(unsigned char c) {
    return json_is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

enum { JSON_OK, JSON_TOO_DEEP, JSON_BAD_CTRL, JSON_BAD_NUMBER, JSON_BAD_ESCAPE };

/*
** One pass over the text for the problems cJSON does not report (see the
** top comment). Returns the first one and its 0-based offset in *pos. On
** invalid text the pass may be wrong about where strings are, but only
** after the point where cJSON itself fails, and the caller reports
** whichever problem comes first.
*/
static int json_scan(const unsigned char *s, size_t len, int max_depth, size_t *pos, int *has_nul) {
    size_t i;
    int depth = 0, in_string = 0;
    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (in_string) {
            if (c == '"') {
                in_string = 0;
            } else if (c == '\\') {
                if (i + 1 < len && s[i + 1] == 'u') {
                    if (i + 5 >= len || !json_is_hex(s[i + 2]) || !json_is_hex(s[i + 3]) ||
                        !json_is_hex(s[i + 4]) || !json_is_hex(s[i + 5])) {
                        *pos = i;
                        return JSON_BAD_ESCAPE;
                    }
                    if (s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
                        *has_nul = 1;
                    i += 5;
                } else {
                    i++; /* the escaped character; cJSON checks that it is valid */
                }
            } else if (c < 0x20) {
                *pos = i;
                return JSON_BAD_CTRL;
            }
            continue;
        }
        if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) {
                *pos = i;
                return JSON_TOO_DEEP;
            }
        } else if (c == ']' || c == '}') {
            if (depth > 0) depth--;
        } else if (c == '-' || json_is_digit(c)) {
            size_t end = json_scan_number(s, len, i);
            if (end == (size_t)-1) {
                *pos = i;
                return JSON_BAD_NUMBER;
            }
            i = end - 1;
        } else if (c < 0x20 && !json_is_ws(c)) {
            /* cJSON skips every byte <= 0x20 as whitespace; JSON allows only four. */
            *pos = i;
            return JSON_BAD_CTRL;
        }
    }
    return JSON_OK;
}

/*
** cJSON decodes \u0000 to a NUL byte that ends its C string. When the
** text has one, it is parsed again from a copy where, inside strings,
** \u0000 becomes the bytes FF '0' and a raw FF byte becomes FF FF (cJSON
** passes bytes >= 0x80 through untouched, and FF never comes out of a
** \u escape); json_push_string undoes this. Returns the copy's length.
*/
static size_t json_mark_nuls(const unsigned char *s, size_t len, unsigned char *out) {
    size_t i, n = 0;
    int in_string = 0;
    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (!in_string) {
            if (c == '"') in_string = 1;
            out[n++] = c;
        } else if (c == '"') {
            in_string = 0;
            out[n++] = c;
        } else if (c == '\\' && i + 5 < len && s[i + 1] == 'u' && s[i + 2] == '0' && s[i + 3] == '0' &&
                   s[i + 4] == '0' && s[i + 5] == '0') {
            out[n++] = 0xff;
            out[n++] = '0';
            i += 5;
        } else if (c == '\\' && i + 1 < len) {
            out[n++] = c;
            out[n++] = s[++i];
        } else if (c == 0xff) {
            out[n++] = 0xff;
            out[n++] = 0xff;
        } else {
            out[n++] = c;
        }
    }
    return n;
}

/* Pushes a decoded string, undoing json_mark_nuls when marked is set. */
static void json_push_string(lua_State *L, const char *s, int marked) {
    luaL_Buffer b;
    if (!marked || strchr(s, 0xff) == NULL) {
        lua_pushstring(L, s);
        return;
    }
    luaL_buffinit(L, &b);
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s == 0xff && s[1] != '\0') {
            s++;
            luaL_addchar(&b, *s == '0' ? '\0' : (char)0xff);
        } else {
            luaL_addchar(&b, *s);
        }
    }
    luaL_pushresult(&b);
}

/* Pushes a JSON number: an integer when it is integral and within +-2^53, else a float. */
static int json_push_number(lua_State *L, double d) {
    if (!isfinite(d)) return 0; /* e.g. 1e400: strtod overflowed */
    if (d >= -(double)MC_MAX_SAFE_INT && d <= (double)MC_MAX_SAFE_INT &&
        d == (double)(lua_Integer)d && !(d == 0 && signbit(d)))
        lua_pushinteger(L, (lua_Integer)d);
    else
        lua_pushnumber(L, d);
    return 1;
}

/*
** Pushes the Lua value of node. json_scan has already bounded the nesting
** by max_depth (<= 1000), so the C recursion is bounded too. Returns 0 for
** a number out of range. marked: strings went through json_mark_nuls.
*/
static int json_to_lua(lua_State *L, const cJSON *node, int marked) {
    const cJSON *c;
    luaL_checkstack(L, 4, "json.decode: nesting too deep");
    if (cJSON_IsNull(node)) {
        lua_pushlightuserdata(L, NULL);
    } else if (cJSON_IsFalse(node)) {
        lua_pushboolean(L, 0);
    } else if (cJSON_IsTrue(node)) {
        lua_pushboolean(L, 1);
    } else if (cJSON_IsNumber(node)) {
        return json_push_number(L, node->valuedouble);
    } else if (cJSON_IsString(node)) {
        json_push_string(L, node->valuestring, marked);
    } else if (cJSON_IsArray(node)) {
        lua_Integer n = 0;
        size_t count = 0;
        for (c = node->child; c != NULL; c = c->next) count++;
        lua_createtable(L, count > INT_MAX ? INT_MAX : (int)count, 0);
        for (c = node->child; c != NULL; c = c->next) {
            if (!json_to_lua(L, c, marked)) return 0;
            lua_rawseti(L, -2, ++n);
        }
        lua_pushvalue(L, JSON_UV_ARRAY_MT);
        lua_setmetatable(L, -2);
    } else if (cJSON_IsObject(node)) {
        size_t count = 0;
        for (c = node->child; c != NULL; c = c->next) count++;
        lua_createtable(L, 0, count > INT_MAX ? INT_MAX : (int)count);
        for (c = node->child; c != NULL; c = c->next) {
            json_push_string(L, c->string != NULL ? c->string : "", marked);
            if (!json_to_lua(L, c, marked)) return 0;
            lua_rawset(L, -3); /* a repeated key: the last one wins */
        }
        lua_pushvalue(L, JSON_UV_OBJECT_MT);
        lua_setmetatable(L, -2);
    } else {
        /* cJSON_Raw or cJSON_Invalid never come out of the parser. */
        lua_pushlightuserdata(L, NULL);
    }
    return 1;
}

/* core.json.decode(str [, { max_depth = n }]) -> value, or nil, err */
static int l_json_decode(lua_State *L) {
    size_t len, i, ppos = 0, epos = 0;
    const unsigned char *s;
    const char *end = NULL;
    int max_depth, problem, failed = 0, has_nul = 0;
    json_box *box;
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "json.decode: expected a string, got %s",
                        luaL_typename(L, 1));
    s = (const unsigned char *)lua_tolstring(L, 1, &len);
    max_depth = json_opt_depth(L, "decode");

    for (i = 0; i < len && json_is_ws(s[i]); i++) {}
    if (i == len) return mc_fail(L, "INVALID_INPUT", "invalid JSON: empty input");

    problem = json_scan(s, len, max_depth, &ppos, &has_nul);

    box = json_box_new(L);
    box->tree = cJSON_ParseWithLengthOpts((const char *)s, len, &end, 0);
    if (box->tree == NULL) {
        /* cJSON points at the failure, clamped to the last byte. */
        failed = 1;
        epos = end != NULL && (const unsigned char *)end >= s ? (size_t)((const unsigned char *)end - s) : 0;
    } else {
        /* cJSON stops after the value: only whitespace may follow. */
        size_t at = (size_t)((const unsigned char *)end - s);
        while (at < len && json_is_ws(s[at])) at++;
        if (at < len) {
            failed = 2;
            epos = at;
        }
    }
    if (problem != JSON_OK && (!failed || ppos <= epos)) {
        json_box_clear(box);
        switch (problem) {
        case JSON_TOO_DEEP:
            return mc_fail(L, "INVALID_INPUT", "invalid JSON: nesting deeper than max_depth %d near byte %zu",
                           max_depth, ppos + 1);
        case JSON_BAD_CTRL:
            return mc_fail(L, "INVALID_INPUT", "invalid JSON near byte %zu: unescaped control character 0x%02x",
                           ppos + 1, s[ppos]);
        case JSON_BAD_NUMBER:
            return mc_fail(L, "INVALID_INPUT", "invalid JSON near byte %zu: malformed number", ppos + 1);
        default:
            return mc_fail(L, "INVALID_INPUT", "invalid JSON near byte %zu: bad \\u escape", ppos + 1);
        }
    }
    if (failed) {
        json_box_clear(box);
        if (failed == 2)
            return mc_fail(L, "INVALID_INPUT", "invalid JSON near byte %zu: data after the value",
                           epos + 1);
        return mc_fail(L, "INVALID_INPUT", "invalid JSON near byte %zu", epos + 1);
    }
    if (has_nul) {
        size_t n;
        /* Marking at most doubles the text (a raw FF byte becomes two). */
        if (len > SIZE_MAX / 2) json_oom(L, "decode");
        box->copy = (char *)malloc(len * 2 + 1);
        if (box->copy == NULL) json_oom(L, "decode");
        n = json_mark_nuls(s, len, (unsigned char *)box->copy);
        cJSON_Delete(box->tree);
        box->tree = cJSON_ParseWithLengthOpts(box->copy, n, NULL, 0);
        /* The marked text is as valid as the original: a NULL is an allocation failure. */
        if (box->tree == NULL) json_oom(L, "decode");
    }
    if (!json_to_lua(L, box->tree, has_nul)) {
        json_box_clear(box);
        return mc_fail(L, "INVALID_INPUT", "invalid JSON: number out of range");
    }
    json_box_clear(box);
    return 1;
}

/* }====================================================== */

/* {======================================================
** Encoding
** =======================================================*/

typedef struct {
    lua_State *L;
    json_box *box;
    int max_depth;
} json_enc;

/*
** Escapes s as a quoted JSON string into the box's scratch buffer (NUL
** terminated). Same escapes as cJSON uses for keys: \" \\ \b \f \n \r \t,
** other bytes < 0x20 as \u00xx; bytes >= 0x80 unchanged.
*/
static const char *json_escape(json_enc *e, const unsigned char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    size_t need = 3, i; /* two quotes and the NUL */
    char *o;
    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
            need += 2;
        else if (c < 0x20)
            need += 6;
        else
            need += 1;
    }
    if (need > e->box->scratch_cap) {
        /* realloc keeps the old block on failure; the box still owns it. */
        char *p = (char *)realloc(e->box->scratch, need);
        if (p == NULL) json_oom(e->L, "encode");
        e->box->scratch = p;
        e->box->scratch_cap = need;
    }
    o = e->box->scratch;
    *o++ = '"';
    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        switch (c) {
        case '"': *o++ = '\\'; *o++ = '"'; break;
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\b': *o++ = '\\'; *o++ = 'b'; break;
        case '\f': *o++ = '\\'; *o++ = 'f'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        default:
            if (c < 0x20) {
                *o++ = '\\'; *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    *o = '\0';
    return e->box->scratch;
}

/*
** Formats a finite double as the shortest of %.15g / %.16g / %.17g that reads
** back to the same value (%.17g always does).
*/
static void json_format_double(char *buf, size_t size, double d) {
    int prec;
    char *p;
    for (prec = 15; prec < 17; prec++) {
        snprintf(buf, size, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    if (prec == 17) snprintf(buf, size, "%.17g", d);
    /* A locale may print a decimal comma; JSON wants a point. */
    for (p = buf; *p != '\0'; p++)
        if (!json_is_digit((unsigned char)*p) && *p != '-' && *p != '+' && *p != 'e' && *p != 'E')
            *p = '.';
}

/* Adds item to parent (under key for an object) or makes it the root; frees it and raises on failure. */
static void json_attach(json_enc *e, cJSON *parent, const char *key, cJSON *item) {
    if (item == NULL) json_oom(e->L, "encode");
    if (parent == NULL) {
        e->box->tree = item;
        return;
    }
    if (!(key != NULL ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item))) {
        cJSON_Delete(item);
        json_oom(e->L, "encode");
    }
}

enum { JSON_KIND_ARRAY, JSON_KIND_OBJECT };

/* Decides whether the table at idx is an array (setting *n) or an object; raises when it is neither. */
static int json_table_kind(json_enc *e, int idx, lua_Integer *n) {
    lua_State *L = e->L;
    lua_Integer count = 0, max = 0;
    int nstr = 0, badint = 0;
    if (lua_getmetatable(L, idx)) {
        int kind = -1;
        if (lua_rawequal(L, -1, JSON_UV_ARRAY_MT)) kind = JSON_KIND_ARRAY;
        else if (lua_rawequal(L, -1, JSON_UV_OBJECT_MT)) kind = JSON_KIND_OBJECT;
        lua_pop(L, 1);
        if (kind == JSON_KIND_ARRAY) {
            *n = (lua_Integer)lua_rawlen(L, idx);
            return kind;
        }
        if (kind == JSON_KIND_OBJECT) return kind;
    }
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) {
            nstr = 1;
        } else if (lua_isinteger(L, -1)) {
            lua_Integer k = lua_tointeger(L, -1);
            if (k >= 1) {
                count++;
                if (k > max) max = k;
            } else {
                badint = 1;
            }
        } else if (lua_type(L, -1) == LUA_TNUMBER) {
            mc_raise(L, "INVALID_INPUT", "json.encode: table key %s is not an integer or a string",
                     lua_tostring(L, -1));
        } else {
            mc_raise(L, "INVALID_INPUT", "json.encode: table key of type %s (keys must be strings, "
                     "or integers 1..n)", luaL_typename(L, -1));
        }
        if (nstr && (count > 0 || badint))
            mc_raise(L, "INVALID_INPUT", "json.encode: table mixes string and integer keys");
    }
    if (nstr) return JSON_KIND_OBJECT;
    if (count == 0 && !badint) {
        *n = 0;
        return JSON_KIND_OBJECT; /* {} */
    }
    if (badint || count != max)
        mc_raise(L, "INVALID_INPUT", "json.encode: sparse array (integer keys are not exactly 1..n)");
    *n = max;
    return JSON_KIND_ARRAY;
}

/*
** Encodes the value at idx (absolute) and adds it to parent under key
** (key NULL: array element; parent NULL: the root). depth is the number
** of tables around the value. A container is attached before it is
** filled, so at any error everything built hangs from the box's tree.
*/
static void json_encode_value(json_enc *e, int idx, cJSON *parent, const char *key, int depth) {
    lua_State *L = e->L;
    char buf[64];
    switch (lua_type(L, idx)) {
    case LUA_TNONE:
    case LUA_TNIL:
        json_attach(e, parent, key, cJSON_CreateNull());
        break;
    case LUA_TBOOLEAN:
        json_attach(e, parent, key, cJSON_CreateBool(lua_toboolean(L, idx)));
        break;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, idx));
        } else {
            double d = (double)lua_tonumber(L, idx);
            if (!isfinite(d))
                mc_raise(L, "INVALID_INPUT", "json.encode: cannot encode %s", isnan(d) ? "NaN" : "infinity");
            json_format_double(buf, sizeof buf, d);
        }
        json_attach(e, parent, key, cJSON_CreateRaw(buf));
        break;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        json_attach(e, parent, key, cJSON_CreateRaw(json_escape(e, (const unsigned char *)s, len)));
        break;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) != NULL)
            mc_raise(L, "INVALID_INPUT", "json.encode: cannot encode a light userdata");
        json_attach(e, parent, key, cJSON_CreateNull());
        break;
    case LUA_TTABLE: {
        lua_Integer n = 0, i;
        cJSON *node;
        int kind;
        if (depth + 1 > e->max_depth)
            mc_raise(L, "INVALID_INPUT", "json.encode: nesting deeper than max_depth %d (or a cycle)",
                     e->max_depth);
        luaL_checkstack(L, 6, "json.encode: nesting too deep");
        kind = json_table_kind(e, idx, &n);
        node = kind == JSON_KIND_ARRAY ? cJSON_CreateArray() : cJSON_CreateObject();
        json_attach(e, parent, key, node);
        if (kind == JSON_KIND_ARRAY) {
            for (i = 1; i <= n; i++) {
                lua_rawgeti(L, idx, i);
                json_encode_value(e, lua_gettop(L), node, NULL, depth + 1);
                lua_pop(L, 1);
            }
        } else {
            lua_pushnil(L);
            while (lua_next(L, idx) != 0) {
                size_t klen;
                const char *k;
                if (lua_type(L, -2) != LUA_TSTRING)
                    mc_raise(L, "INVALID_INPUT", "json.encode: object key of type %s (must be a string)",
                             luaL_typename(L, -2));
                k = lua_tolstring(L, -2, &klen);
                /* cJSON keeps keys as C strings. */
                if (strlen(k) != klen)
                    mc_raise(L, "INVALID_INPUT", "json.encode: object key contains a NUL byte");
                json_encode_value(e, lua_gettop(L), node, k, depth + 1);
                lua_pop(L, 1);
            }
        }
        break;
    }
    default:
        mc_raise(L, "INVALID_INPUT", "json.encode: cannot encode a %s", luaL_typename(L, idx));
    }
}

/* core.json.encode(value [, { max_depth = n }]) -> string */
static int l_json_encode(lua_State *L) {
    json_enc e;
    if (lua_isnone(L, 1)) lua_pushnil(L);
    e.L = L;
    e.max_depth = json_opt_depth(L, "encode");
    lua_settop(L, 2);
    e.box = json_box_new(L);
    json_encode_value(&e, 1, NULL, NULL, 0);
    e.box->text = cJSON_PrintUnformatted(e.box->tree);
    if (e.box->text == NULL) json_oom(L, "encode");
    lua_pushstring(L, e.box->text);
    json_box_clear(e.box);
    return 1;
}

/* }====================================================== */

static void mc_open_json(lua_State *L) {
    static const luaL_Reg funcs[] = {
        {"encode", l_json_encode},
        {"decode", l_json_decode},
        {NULL, NULL}
    };
    mc_class_register(L, &json_box_class);
    lua_createtable(L, 0, 4);
    luaL_newmetatable(L, JSON_ARRAY_MT);
    luaL_newmetatable(L, JSON_OBJECT_MT);
    luaL_setfuncs(L, funcs, 2); /* both metatables are upvalues of both functions */
    luaL_getmetatable(L, JSON_ARRAY_MT);
    lua_setfield(L, -2, "array_mt");
    luaL_getmetatable(L, JSON_OBJECT_MT);
    lua_setfield(L, -2, "object_mt");
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
    lua_setfield(L, -2, "json");
}
