/*
** fs.c: core.fs, asynchronous file operations on the shared loop.
** The operations themselves (atomic write, mkdir -p, recursive remove)
** are core/files.h's, shared with the in-sandbox agent.
**
** read, write (atomic replace), list, remove (optionally recursive, never
** following symlinks), stat and mkdir. Each call checks its arguments at
** once, then runs the blocking POSIX code in libuv's threadpool and calls
** back on the loop thread: the loop itself never waits for a disk.
**
** Notes:
**  - write does not fsync: the rename makes the replacement atomic for
**    readers, but after a power loss the file may be empty or old. It is
**    a speed trade: the callers here write caches and working files.
**  - write's mode is applied exactly (fchmod, no umask); mkdir's goes
**    through the umask like mkdir(2). A replaced file gets a new inode, so
**    its old owner, ACLs and hard links are not carried over, and a symlink
**    at the target is replaced by the file, not written through.
**  - recursive remove keeps one descriptor open per directory level, so a
**    tree deeper than the descriptor limit fails with EMFILE.
*/
#include "mc.h"
#include "files.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum { FS_READ, FS_WRITE, FS_LIST, FS_REMOVE, FS_STAT, FS_MKDIR };

/* What the work came to: a result, nothing there, or an error. */
enum { FS_DONE, FS_MISSING, FS_FAILED };

/* Without max_bytes a read is bounded only by memory; this keeps max+1 from overflowing. */
#define FS_READ_HARD_MAX ((size_t)PTRDIFF_MAX - 1)

typedef struct fs_entry {
    char *name;
    const char *type;
    int64_t size;
    int64_t modified;
} fs_entry;

typedef struct fs_opts {
    size_t max_bytes;   /* read */
    mode_t mode;        /* write, mkdir */
    int mkdir;          /* write */
    int recursive;      /* remove */
} fs_opts;

typedef struct fs_req {
    uv_work_t work;
    lua_State *L;       /* main thread: where the callback runs */
    int op;
    int cb_ref;
    int data_ref;       /* write: keeps the data string alive while a worker reads it */
    const char *data;   /* write: the string's bytes (Lua never moves a string) */
    size_t len;
    fs_opts o;
    /* results, filled by the worker */
    int outcome;
    const char *code;   /* FS_FAILED: error code */
    int err;            /* FS_FAILED: errno, or 0 for none */
    char msg[96];
    char *buf;          /* read */
    size_t buflen;
    fs_entry *entries;  /* list */
    size_t nentries;
    struct stat st;     /* stat */
    char path[];
} fs_req;

/* {======================================================
** Worker side: plain POSIX, never Lua
** =======================================================*/

static void fs_fail(fs_req *r, const char *code, int err, const char *msg) {
    r->outcome = FS_FAILED;
    r->code = code;
    r->err = err;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

static int64_t fs_mtime_ms(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

/* Whether errno means "nothing at this path" (a missing entry or a file in the middle). */
static int fs_missing_errno(int e) {
    return e == ENOENT || e == ENOTDIR;
}

static void fs_do_read(fs_req *r) {
    struct stat st;
    size_t limit = r->o.max_bytes, cap, len = 0;
    char *buf;
    int fd, flags;
    /* O_NONBLOCK so that opening a fifo with no writer returns at once; it is refused below. */
    fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (fs_missing_errno(errno)) r->outcome = FS_MISSING;
        else fs_fail(r, "IO_ERROR", errno, "cannot read");
        return;
    }
    if (fstat(fd, &st) != 0) {
        fs_fail(r, "IO_ERROR", errno, "cannot read");
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        fs_fail(r, "INVALID_INPUT", 0, S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
        close(fd);
        return;
    }
    if ((flags = fcntl(fd, F_GETFL)) == -1 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == -1) {
        fs_fail(r, "IO_ERROR", errno, "cannot read");
        close(fd);
        return;
    }
    if ((uintmax_t)st.st_size > (uintmax_t)limit) {
        snprintf(r->msg, sizeof r->msg, "file is larger than %zu bytes", limit);
        r->outcome = FS_FAILED;
        r->code = "LIMIT_EXCEEDED";
        r->err = 0;
        close(fd);
        return;
    }
    /* Room for the size fstat gave and one byte more, to see the end in one read. */
    cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
    if (cap > limit + 1) cap = limit + 1;
    buf = malloc(cap);
    if (buf == NULL) {
        fs_fail(r, MC_OOM_CODE, ENOMEM, "cannot read");
        close(fd);
        return;
    }
    for (;;) {
        ssize_t n;
        if (len == cap) {
            size_t ncap;
            char *nbuf;
            /* The file grew past the limit since fstat: stop, do not read on. */
            if (cap > limit) break;
            ncap = cap > (limit + 1) / 2 ? limit + 1 : cap * 2;
            nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                fs_fail(r, MC_OOM_CODE, ENOMEM, "cannot read");
                free(buf);
                close(fd);
                return;
            }
            buf = nbuf;
            cap = ncap;
        }
        n = read(fd, buf + len, cap - len);
        if (n < 0) {
            if (errno == EINTR) continue;
            fs_fail(r, "IO_ERROR", errno, "cannot read");
            free(buf);
            close(fd);
            return;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (len > limit) {
        snprintf(r->msg, sizeof r->msg, "file is larger than %zu bytes", limit);
        r->outcome = FS_FAILED;
        r->code = "LIMIT_EXCEEDED";
        r->err = 0;
        free(buf);
        return;
    }
    r->buf = buf;
    r->buflen = len;
    r->outcome = FS_DONE;
}

static void fs_do_write(fs_req *r) {
    int e = files_write_atomic(r->path, r->data, r->len, r->o.mode, r->o.mkdir);
    if (e == ENOMEM) fs_fail(r, MC_OOM_CODE, ENOMEM, "cannot write");
    else if (e != 0) fs_fail(r, "IO_ERROR", e, "cannot write");
    else r->outcome = FS_DONE;
}

static int fs_entry_cmp(const void *a, const void *b) {
    return strcmp(((const fs_entry *)a)->name, ((const fs_entry *)b)->name);
}

static void fs_do_list(fs_req *r) {
    struct stat st;
    struct dirent *de;
    DIR *d;
    size_t cap = 0;
    int fd = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) r->outcome = FS_MISSING;
        else if (e == ENOTDIR) {
            /* Either the path is not a directory, or a file sits in the middle of it. */
            if (lstat(r->path, &st) == 0) fs_fail(r, "INVALID_INPUT", 0, "not a directory");
            else r->outcome = FS_MISSING;
        } else {
            fs_fail(r, "IO_ERROR", e, "cannot list");
        }
        return;
    }
    d = fdopendir(fd);
    if (d == NULL) {
        fs_fail(r, "IO_ERROR", errno, "cannot list");
        close(fd);
        return;
    }
    for (;;) {
        fs_entry *ent;
        errno = 0;
        de = readdir(d);
        if (de == NULL) {
            if (errno != 0) fs_fail(r, "IO_ERROR", errno, "cannot list");
            break;
        }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;   /* removed since readdir */
            fs_fail(r, "IO_ERROR", errno, "cannot list");
            break;
        }
        if (r->nentries == cap) {
            size_t ncap = cap ? cap * 2 : 32;
            fs_entry *n = realloc(r->entries, ncap * sizeof *n);
            if (n == NULL) {
                fs_fail(r, MC_OOM_CODE, ENOMEM, "cannot list");
                break;
            }
            r->entries = n;
            cap = ncap;
        }
        ent = &r->entries[r->nentries];
        ent->name = strdup(de->d_name);
        if (ent->name == NULL) {
            fs_fail(r, MC_OOM_CODE, ENOMEM, "cannot list");
            break;
        }
        ent->type = files_type_name(st.st_mode);
        ent->size = (int64_t)st.st_size;
        ent->modified = fs_mtime_ms(&st);
        r->nentries++;
    }
    closedir(d);
    if (r->outcome == FS_FAILED) return;
    if (r->nentries > 1) qsort(r->entries, r->nentries, sizeof *r->entries, fs_entry_cmp);
    r->outcome = FS_DONE;
}

static void fs_do_remove(fs_req *r) {
    struct stat st;
    char *p = r->path;
    size_t len = strlen(p);
    int e;
    /* "link/" would resolve the link: the entry itself is meant. */
    while (len > 1 && p[len - 1] == '/') p[--len] = '\0';
    if (lstat(p, &st) != 0) {
        if (fs_missing_errno(errno)) r->outcome = FS_MISSING;
        else fs_fail(r, "IO_ERROR", errno, "cannot remove");
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        e = unlink(p) == 0 ? 0 : errno;
    } else {
        e = 0;
        if (r->o.recursive) {
            int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            e = fd < 0 ? errno : files_remove_tree(fd);
        }
        if (e == 0 && rmdir(p) != 0) e = errno;
        if (e == EEXIST) e = ENOTEMPTY;   /* POSIX allows either */
    }
    if (e == 0) r->outcome = FS_DONE;
    else if (e == ENOENT) r->outcome = FS_MISSING;   /* gone meanwhile */
    else fs_fail(r, "IO_ERROR", e, "cannot remove");
}

static void fs_do_stat(fs_req *r) {
    if (lstat(r->path, &r->st) == 0) r->outcome = FS_DONE;
    else if (fs_missing_errno(errno)) r->outcome = FS_MISSING;
    else fs_fail(r, "IO_ERROR", errno, "cannot stat");
}

static void fs_do_mkdir(fs_req *r) {
    int e = files_mkdir_p(r->path, 0755, r->o.mode);
    if (e == 0) r->outcome = FS_DONE;
    else fs_fail(r, "IO_ERROR", e, "cannot create directory");
}

static void fs_work(uv_work_t *w) {
    fs_req *r = (fs_req *)w->data;
    switch (r->op) {
    case FS_READ: fs_do_read(r); break;
    case FS_WRITE: fs_do_write(r); break;
    case FS_LIST: fs_do_list(r); break;
    case FS_REMOVE: fs_do_remove(r); break;
    case FS_STAT: fs_do_stat(r); break;
    default: fs_do_mkdir(r); break;
    }
}

/* }====================================================== */

/* {======================================================
** Loop side: results to Lua
** =======================================================*/

static void fs_free(fs_req *r) {
    size_t i;
    for (i = 0; i < r->nentries; i++) free(r->entries[i].name);
    free(r->entries);
    free(r->buf);
    free(r);
}

static void fs_push_error(lua_State *L, const fs_req *r) {
    if (r->err != 0) {
        char name[64];
        uv_err_name_r(-r->err, name, sizeof name);
        mc_push_error(L, r->code, "%s: %s", r->msg, name);
        mc_error_field(L, "errno", name);
    } else {
        mc_push_error(L, r->code, "%s", r->msg);
    }
}

/* Pushes { type, size, modified } from st. */
static void fs_push_stat(lua_State *L, const char *type, int64_t size, int64_t modified) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, type);
    lua_setfield(L, -2, "type");
    lua_pushinteger(L, (lua_Integer)size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)modified);
    lua_setfield(L, -2, "modified");
}

/*
** Called through mc_call with (callback, request): builds the results and
** calls the callback. Building runs under the same protection as the call,
** so a memory error here is reported like an error in the callback.
*/
static int fs_deliver(lua_State *L) {
    fs_req *r = (fs_req *)lua_touserdata(L, 2);
    int n = 1;
    lua_settop(L, 1);
    if (r->outcome == FS_FAILED) {
        lua_pushnil(L);
        fs_push_error(L, r);
        n = 2;
    } else if (r->outcome == FS_MISSING) {
        if (r->op == FS_REMOVE) lua_pushboolean(L, 0);
        else lua_pushnil(L);
    } else {
        size_t i;
        switch (r->op) {
        case FS_READ:
            lua_pushlstring(L, r->buf != NULL ? r->buf : "", r->buflen);
            free(r->buf);   /* no need to hold two copies of a large file during the callback */
            r->buf = NULL;
            break;
        case FS_LIST:
            lua_createtable(L, (int)r->nentries, 0);
            for (i = 0; i < r->nentries; i++) {
                const fs_entry *e = &r->entries[i];
                fs_push_stat(L, e->type, e->size, e->modified);
                lua_pushstring(L, e->name);
                lua_setfield(L, -2, "name");
                lua_rawseti(L, -2, (lua_Integer)i + 1);
            }
            break;
        case FS_STAT:
            fs_push_stat(L, files_type_name(r->st.st_mode), (int64_t)r->st.st_size, fs_mtime_ms(&r->st));
            lua_pushinteger(L, (lua_Integer)(r->st.st_mode & 07777));
            lua_setfield(L, -2, "mode");
            break;
        default:
            lua_pushboolean(L, 1);
            break;
        }
    }
    lua_call(L, n, 0);
    return 0;
}

static void fs_after(uv_work_t *w, int status) {
    fs_req *r = (fs_req *)w->data;
    lua_State *L = r->L;
    if (status == UV_ECANCELED) fs_fail(r, "IO_ERROR", ECANCELED, "cancelled");
    if (lua_checkstack(L, 5)) {
        lua_pushcfunction(L, fs_deliver);
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->cb_ref);
        lua_pushlightuserdata(L, r);
        mc_call(L, 2);
    } else {
        fprintf(stderr, "mayura: no stack space for a core.fs callback\n");
    }
    luaL_unref(L, LUA_REGISTRYINDEX, r->cb_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, r->data_ref);
    fs_free(r);
}

/* }====================================================== */

/* {======================================================
** Lua side: argument checks and queueing
** =======================================================*/

/* The options table at idx: nil or a table with only the allowed keys. Returns whether it is a table. */
static int fs_check_opts(lua_State *L, int idx, const char *const allowed[]) {
    int t = lua_type(L, idx);
    if (t == LUA_TNONE || t == LUA_TNIL) return 0;
    if (t != LUA_TTABLE) mc_raise(L, "INVALID_INPUT", "options must be a table or nil");
    mc_check_keys(L, idx, allowed);
    return 1;
}

static void fs_check_cb(lua_State *L, int idx) {
    if (lua_type(L, idx) != LUA_TFUNCTION) mc_raise(L, "INVALID_INPUT", "callback must be a function");
}

/*
** Queues op on path once every argument is checked: the callback at cbidx
** (and the data string at dataidx, or 0) are referenced before the request
** is allocated, so no error can leave memory behind.
*/
static int fs_start(lua_State *L, int op, const char *path, const fs_opts *o, int cbidx, int dataidx) {
    uv_loop_t *loop = mc_loop(L);
    size_t plen = strlen(path);
    int cb_ref, data_ref = LUA_NOREF, rc;
    fs_req *r;
    lua_pushvalue(L, cbidx);
    cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (dataidx != 0) {
        lua_pushvalue(L, dataidx);
        data_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    r = (fs_req *)calloc(1, sizeof *r + plen + 1);
    if (r == NULL) {
        luaL_unref(L, LUA_REGISTRYINDEX, cb_ref);
        luaL_unref(L, LUA_REGISTRYINDEX, data_ref);
        return mc_raise_oom(L);
    }
    memcpy(r->path, path, plen + 1);
    r->work.data = r;
    r->L = mc_main(L);
    r->op = op;
    r->cb_ref = cb_ref;
    r->data_ref = data_ref;
    if (dataidx != 0) r->data = lua_tolstring(L, dataidx, &r->len);
    r->o = *o;
    rc = uv_queue_work(loop, &r->work, fs_work, fs_after);
    if (rc != 0) {
        luaL_unref(L, LUA_REGISTRYINDEX, cb_ref);
        luaL_unref(L, LUA_REGISTRYINDEX, data_ref);
        free(r);
        return mc_raise(L, "IO_ERROR", "cannot queue file work: %s", uv_err_name(rc));
    }
    return 0;
}

/* core.fs.read(path, opts, cb): cb(data) | cb(nil) when missing | cb(nil, err) */
static int l_fs_read(lua_State *L) {
    static const char *const keys[] = {"max_bytes", NULL};
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    o.max_bytes = FS_READ_HARD_MAX;
    if (fs_check_opts(L, 2, keys)) {
        lua_Integer m = mc_opt_int(L, 2, "max_bytes", -1, 0, MC_MAX_SAFE_INT);
        if (m >= 0 && (uintmax_t)m < (uintmax_t)FS_READ_HARD_MAX) o.max_bytes = (size_t)m;
    }
    fs_check_cb(L, 3);
    return fs_start(L, FS_READ, path, &o, 3, 0);
}

/* core.fs.write(path, data, opts, cb): cb(true) | cb(nil, err) */
static int l_fs_write(lua_State *L) {
    static const char *const keys[] = {"mode", "mkdir", NULL};
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    o.mode = 0644;
    o.mkdir = 1;
    if (lua_type(L, 2) != LUA_TSTRING) mc_raise(L, "INVALID_INPUT", "data must be a string");
    if (fs_check_opts(L, 3, keys)) {
        o.mode = (mode_t)mc_opt_int(L, 3, "mode", 0644, 0, 07777);
        o.mkdir = mc_opt_bool(L, 3, "mkdir", 1);
    }
    fs_check_cb(L, 4);
    return fs_start(L, FS_WRITE, path, &o, 4, 2);
}

/* core.fs.list(path, cb): cb(entries) | cb(nil) when missing | cb(nil, err) */
static int l_fs_list(lua_State *L) {
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    fs_check_cb(L, 2);
    return fs_start(L, FS_LIST, path, &o, 2, 0);
}

/* core.fs.remove(path, opts, cb): cb(true) removed | cb(false) nothing there | cb(nil, err) */
static int l_fs_remove(lua_State *L) {
    static const char *const keys[] = {"recursive", NULL};
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    if (fs_check_opts(L, 2, keys)) o.recursive = mc_opt_bool(L, 2, "recursive", 0);
    fs_check_cb(L, 3);
    return fs_start(L, FS_REMOVE, path, &o, 3, 0);
}

/* core.fs.stat(path, cb): cb({ type, size, modified, mode }) | cb(nil) when missing | cb(nil, err) */
static int l_fs_stat(lua_State *L) {
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    fs_check_cb(L, 2);
    return fs_start(L, FS_STAT, path, &o, 2, 0);
}

/* core.fs.mkdir(path, opts, cb): cb(true) | cb(nil, err) */
static int l_fs_mkdir(lua_State *L) {
    static const char *const keys[] = {"mode", NULL};
    const char *path = mc_check_path(L, 1, "path");
    fs_opts o;
    memset(&o, 0, sizeof o);
    o.mode = 0755;
    if (fs_check_opts(L, 2, keys)) o.mode = (mode_t)mc_opt_int(L, 2, "mode", 0755, 0, 07777);
    fs_check_cb(L, 3);
    return fs_start(L, FS_MKDIR, path, &o, 3, 0);
}

/* }====================================================== */

static const luaL_Reg fs_funcs[] = {
    {"read", l_fs_read},
    {"write", l_fs_write},
    {"list", l_fs_list},
    {"remove", l_fs_remove},
    {"stat", l_fs_stat},
    {"mkdir", l_fs_mkdir},
    {NULL, NULL}
};

static void mc_open_fs(lua_State *L) {
    luaL_newlib(L, fs_funcs);
    lua_setfield(L, -2, "fs");
}
