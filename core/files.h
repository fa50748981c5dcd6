/*
** files.h: the file operations the host core (core/fs.c) and the in-sandbox
** agent (agent/fileops.c) share: type names, mkdir -p, writing all of a
** buffer, the atomic temp-and-rename write (whole, or begun with
** files_temp_beside and ended with files_temp_commit when the bytes come in
** parts), and the recursive remove that never follows a symlink.
** Header-only, every function static, each returns 0 or an errno (never
** sets a Lua error, never prints), so both ends give the same answers for
** the same tree.
*/
#ifndef MAYURA_FILES_H
#define MAYURA_FILES_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define FILES_UNUSED __attribute__((unused))

/* The longest part of a file's own name kept in its temporary name (stays under NAME_MAX). */
#define FILES_TMP_BASE_MAX 100

/* The listing's name for a file type: 'file', 'directory', 'symlink' or 'other'. */
static FILES_UNUSED const char *files_type_name(mode_t m) {
    if (S_ISREG(m)) return "file";
    if (S_ISDIR(m)) return "directory";
    if (S_ISLNK(m)) return "symlink";
    return "other";
}

static FILES_UNUSED int files_is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
** mkdir -p on a scratch string p (modified): parents get parent_mode, the
** last component mode. An existing directory is fine; an existing
** non-directory is ENOTDIR (EEXIST for the last component). Components are
** cut off the end until one can be made, so an existing prefix costs no
** system call.
*/
static FILES_UNUSED int files_mkdir_p(char *p, mode_t parent_mode, mode_t mode) {
    size_t len = strlen(p);
    char *cut, *end;
    int e;
    while (len > 1 && p[len - 1] == '/') p[--len] = '\0';
    end = p + len;
    if (mkdir(p, mode) == 0) return 0;
    e = errno;
    if (e == EEXIST) return files_is_dir(p) ? 0 : EEXIST;
    if (e != ENOENT) return e;
    cut = end;
    for (;;) {
        char *q, *slash = NULL;
        for (q = cut - 1; q > p; q--)
            if (*q == '/') { slash = q; break; }
        if (slash == NULL) return ENOENT;
        *slash = '\0';
        cut = slash;
        if (mkdir(p, parent_mode) == 0) break;
        e = errno;
        if (e == EEXIST) {
            if (files_is_dir(p)) break;
            return ENOTDIR;
        }
        if (e != ENOENT) return e;
    }
    /* Put the slashes back one by one, making each directory on the way. */
    while (cut < end) {
        char *next;
        *cut = '/';
        next = cut + strlen(cut);
        if (mkdir(p, next == end ? mode : parent_mode) != 0) {
            e = errno;
            if (!(e == EEXIST && files_is_dir(p))) return e;
        }
        cut = next;
    }
    return 0;
}

/* Writes all of data to fd, in pieces of at most 1 GiB. */
static FILES_UNUSED int files_write_all(int fd, const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t n = write(fd, p, chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Makes a temporary file beside path, "<dir>/.<base>.mayura-XXXXXX"; its name is left in tmp. */
static FILES_UNUSED int files_temp_open(char *tmp, const char *path, size_t dirlen, const char *base, size_t baselen) {
    memcpy(tmp, path, dirlen);
    tmp[dirlen] = '.';
    memcpy(tmp + dirlen + 1, base, baselen);
    memcpy(tmp + dirlen + 1 + baselen, ".mayura-XXXXXX", sizeof ".mayura-XXXXXX");
    return mkostemp(tmp, O_CLOEXEC);
}

/*
** Opens a new temporary file beside path, for a write that replaces path
** all or nothing (files_temp_commit finishes it): its descriptor in *fd and
** its name in *tmp (malloc'd: the caller frees it). Missing parents are
** made (0755) when make_parents, and only once the first try says they are
** missing, so the common case costs nothing. A path ending in '/' is EISDIR.
*/
static FILES_UNUSED int files_temp_beside(const char *path, int make_parents, int *fd, char **tmp) {
    const char *slash = strrchr(path, '/');
    const char *base = slash != NULL ? slash + 1 : path;
    size_t dirlen = slash != NULL ? (size_t)(slash - path) + 1 : 0;
    size_t baselen = strlen(base);
    char *t;
    int e;
    if (baselen == 0) return EISDIR;   /* "dir/": a file name cannot end with a slash */
    if (baselen > FILES_TMP_BASE_MAX) baselen = FILES_TMP_BASE_MAX;
    t = (char *)malloc(dirlen + 1 + baselen + sizeof ".mayura-XXXXXX");
    if (t == NULL) return ENOMEM;
    *fd = files_temp_open(t, path, dirlen, base, baselen);
    e = *fd < 0 ? errno : 0;
    if (*fd < 0 && e == ENOENT && make_parents && dirlen > 1) {
        char *dir = (char *)malloc(dirlen + 1);
        if (dir == NULL) {
            e = ENOMEM;
        } else {
            memcpy(dir, path, dirlen);
            dir[dirlen] = '\0';
            e = files_mkdir_p(dir, 0755, 0755);
            free(dir);
        }
        if (e == 0) {
            *fd = files_temp_open(t, path, dirlen, base, baselen);
            e = *fd < 0 ? errno : 0;
        }
    }
    if (*fd < 0) {
        free(t);
        return e;
    }
    *tmp = t;
    return 0;
}

/*
** Ends a write begun by files_temp_beside whose bytes all went to fd: gives
** it mode, closes fd, and renames tmp over path. On failure the temporary
** file is removed and the old file stays. fd is closed either way; tmp is
** left to the caller to free.
*/
static FILES_UNUSED int files_temp_commit(int fd, const char *tmp, const char *path, mode_t mode) {
    int e = 0;
    if (fchmod(fd, mode) != 0) e = errno;
    /* close can report a delayed write error (NFS); EINTR still closed the descriptor. */
    if (close(fd) != 0 && e == 0 && errno != EINTR) e = errno;
    if (e == 0 && rename(tmp, path) != 0) e = errno;
    if (e != 0) unlink(tmp);
    return e;
}

/*
** Replaces the file at path with data, all or nothing: the bytes go to a
** temporary file beside it, which is then renamed over it, so a reader
** never sees half a file and a failure leaves the old one (see
** files_temp_beside for make_parents and a path ending in '/').
*/
static FILES_UNUSED int files_write_atomic(const char *path, const void *data, size_t len, mode_t mode,
                                           int make_parents) {
    char *tmp = NULL;
    int fd, e = files_temp_beside(path, make_parents, &fd, &tmp);
    if (e != 0) return e;
    e = files_write_all(fd, data, len);
    if (e == 0) {
        e = files_temp_commit(fd, tmp, path, mode);
    } else {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    return e;
}

static int files_remove_tree(int dfd);

/*
** Removes entry name of the directory dfd and, for a directory, all in it.
** dtype is readdir's d_type (DT_UNKNOWN when not known: then it is looked
** up). Never follows a symlink: a directory is opened with O_NOFOLLOW, and
** an entry swapped for a symlink or a file since is unlinked itself, so
** nothing outside the tree is ever walked. An entry made inside meanwhile
** is walked again (three tries).
*/
static FILES_UNUSED int files_remove_at(int dfd, const char *name, unsigned char dtype) {
    int isdir, sub, e, tries;
    if (dtype == DT_DIR) {
        isdir = 1;
    } else if (dtype != DT_UNKNOWN) {
        isdir = 0;
    } else {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : errno;
        isdir = S_ISDIR(st.st_mode);
    }
    if (!isdir) {
        if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return 0;
        if (errno != EISDIR && errno != EPERM) return errno;
    }
    for (tries = 0; tries < 3; tries++) {
        sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (sub < 0) {
            e = errno;
            if (e == ENOENT) return 0;
            if (e == ELOOP || e == ENOTDIR)
                return unlinkat(dfd, name, 0) == 0 || errno == ENOENT ? 0 : errno;
            return e;
        }
        if ((e = files_remove_tree(sub)) != 0) return e;
        if (unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
        if (errno != ENOTEMPTY && errno != EEXIST) return errno;
    }
    return ENOTEMPTY;
}

/* Empties the directory dfd (taken over and closed). */
static int files_remove_tree(int dfd) {
    DIR *d = fdopendir(dfd);
    int e = 0, again = 1;
    if (d == NULL) {
        e = errno;
        close(dfd);
        return e;
    }
    /* Removing while reading may make readdir skip entries: read again until a pass finds nothing. */
    while (e == 0 && again) {
        again = 0;
        for (;;) {
            struct dirent *de;
            errno = 0;
            de = readdir(d);
            if (de == NULL) {
                e = errno;
                break;
            }
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
            again = 1;
            e = files_remove_at(dirfd(d), de->d_name, de->d_type);
            if (e != 0) break;
        }
        if (e == 0 && again) rewinddir(d);
    }
    closedir(d);
    return e;
}

#endif
