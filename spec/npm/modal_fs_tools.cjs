#!/usr/bin/node
// The Modal stand-in's `modal-sandbox-fs-tools` (spec/npm/modal_stand_in.mjs mounts it read-only at
// /__modal/.bin/ in every sandbox, where a Modal sandbox has a tool of that name): the file
// operations Modal's SDK runs as commands, one JSON object as the only argument, in the sandbox,
// as the command's user:
//   { ReadFile: { path } }                   the file's bytes on stdout
//   { WriteFile: { path } }                  standard input into the file (parents made; written
//                                            beside it and renamed over it)
//   { ListFiles: { path } }                  a JSON list of entries, sorted by name
//   { Stat: { path } }                       one entry (a link's own, not its target's)
//   { MakeDirectory: { path, parents } }     a directory (with its parents, idempotent, if parents)
//   { Remove: { path, recursive } }          a file, a link, or a directory (empty unless recursive)
// An entry is { name, path, type ('file', 'directory' or 'symlink'), size, mode, permissions,
// owner, group, modified_time (epoch seconds), symlink_target }. A failure exits 1 with
// { error_kind, message, detail } on stderr: NotFound, IsDirectory, NotDirectory, PermissionDenied,
// PathAlreadyExists, DirectoryNotEmpty, or Other.
'use strict';
const fs = require('fs');
const path = require('path');

const KINDS = {
  ENOENT: ['NotFound', 'No such file or directory'],
  EISDIR: ['IsDirectory', 'Is a directory'],
  ENOTDIR: ['NotDirectory', 'Not a directory'],
  EACCES: ['PermissionDenied', 'Permission denied'],
  EPERM: ['PermissionDenied', 'Operation not permitted'],
  EEXIST: ['PathAlreadyExists', 'Path already exists'],
  ENOTEMPTY: ['DirectoryNotEmpty', 'Directory not empty'],
};

function fail(kind, message, detail) {
  process.stderr.write(JSON.stringify({ error_kind: kind, message, detail: detail ?? '' }));
  process.exit(1);
}

function failWith(err) {
  const [kind, message] = KINDS[err.code] ?? ['Other', 'The operation failed'];
  fail(kind, message, err.code ?? '');
}

function permissions(mode) {
  let out = '';
  for (const shift of [6, 3, 0]) {
    const bits = (mode >> shift) & 7;
    out += (bits & 4 ? 'r' : '-') + (bits & 2 ? 'w' : '-') + (bits & 1 ? 'x' : '-');
  }
  return out;
}

function entry(p) {
  const st = fs.lstatSync(p);
  const link = st.isSymbolicLink();
  return {
    name: path.basename(p), path: p, type: link ? 'symlink' : st.isDirectory() ? 'directory' : 'file',
    size: st.size, mode: st.mode & 0o7777, permissions: permissions(st.mode), owner: String(st.uid),
    group: String(st.gid), modified_time: Math.floor(st.mtimeMs / 1000), symlink_target: link ? fs.readlinkSync(p) : null,
  };
}

function run(cmd) {
  const [op] = Object.keys(cmd);
  const a = cmd[op] ?? {};
  if (typeof a.path !== 'string' || !path.isAbsolute(a.path)) fail('Other', 'The path must be absolute');
  const p = a.path;
  switch (op) {
    case 'ReadFile': {
      if (fs.statSync(p).isDirectory()) fail('IsDirectory', 'Is a directory');
      const fd = fs.openSync(p, 'r');
      const buf = Buffer.alloc(65536);
      for (;;) {
        const n = fs.readSync(fd, buf, 0, buf.length, null);
        if (n === 0) break;
        fs.writeSync(1, buf.subarray(0, n));
      }
      return;
    }
    case 'WriteFile': {
      let isDir = false;
      try { isDir = fs.statSync(p).isDirectory(); } catch { /* not there yet */ }
      if (isDir) fail('IsDirectory', 'Is a directory');
      fs.mkdirSync(path.dirname(p), { recursive: true });
      const tmp = path.join(path.dirname(p), `.${path.basename(p)}.modal-write-${process.pid}`);
      const fd = fs.openSync(tmp, 'wx', 0o644);
      try {
        const buf = Buffer.alloc(65536);
        for (;;) {
          let n;
          try { n = fs.readSync(0, buf, 0, buf.length, null); } catch (e) { if (e.code === 'EAGAIN') continue; throw e; }
          if (n === 0) break;
          fs.writeSync(fd, buf.subarray(0, n));
        }
        fs.closeSync(fd);
        fs.renameSync(tmp, p);
      } catch (e) {
        try { fs.unlinkSync(tmp); } catch { /* gone */ }
        throw e;
      }
      return;
    }
    case 'ListFiles': {
      if (!fs.statSync(p).isDirectory()) fail('NotDirectory', 'Not a directory');
      const names = fs.readdirSync(p).sort();
      process.stdout.write(JSON.stringify(names.map((n) => entry(path.join(p, n)))));
      return;
    }
    case 'Stat':
      process.stdout.write(JSON.stringify(entry(p)));
      return;
    case 'MakeDirectory':
      if (a.parents) fs.mkdirSync(p, { recursive: true });
      else fs.mkdirSync(p);
      return;
    case 'Remove': {
      const st = fs.lstatSync(p);
      if (!st.isDirectory()) fs.unlinkSync(p);
      else if (a.recursive) fs.rmSync(p, { recursive: true });
      else fs.rmdirSync(p);
      return;
    }
    default:
      fail('Other', 'Unknown command');
  }
}

let cmd;
try { cmd = JSON.parse(process.argv[2] ?? ''); } catch { fail('Other', 'The command is not JSON'); }
if (typeof cmd !== 'object' || cmd === null) fail('Other', 'The command is not an object');
try { run(cmd); } catch (e) { failWith(e); }
