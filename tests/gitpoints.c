/* LD_PRELOAD shim for tests/group_interrupts.py: inside every git process a vstack
 * run starts, each call that changes the file system (a file opened for writing,
 * a rename, an unlink, a mkdir/rmdir, a link) is an interrupt point. The points of
 * all git processes of one run are numbered in one counter file; at point
 * VSTACK_POINT_AT, right after the call, the shim sends SIGINT to its whole process
 * group, as a terminal's Ctrl-C does: git and vstack get it at the same moment.
 * Processes other than git (vstack's Python) are left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int active = -1;

static int is_git(void) {
  if (active < 0) {
    extern char *program_invocation_short_name;
    active = getenv("VSTACK_POINTS") != NULL &&
             strcmp(program_invocation_short_name, "git") == 0;
  }
  return active;
}

/* Raw system calls: the shim's own file access must not count or recurse. */
static int raw_open(const char *p, int flags, int mode) {
  return (int)syscall(SYS_openat, AT_FDCWD, p, flags, mode);
}

/* The git subcommand of this process (from /proc/self/cmdline), for the log. */
static const char *subcommand(void) {
  static char sub[64];
  if (sub[0]) return sub;
  strcpy(sub, "?");
  char args[65536];
  int fd = raw_open("/proc/self/cmdline", O_RDONLY, 0);
  if (fd < 0) return sub;
  ssize_t n = read(fd, args, sizeof args - 1);
  close(fd);
  if (n <= 0) return sub;
  args[n] = 0;
  char *a = args + strlen(args) + 1; /* past argv[0] */
  while (a < args + n) {
    if (!strcmp(a, "-C") || !strcmp(a, "-c")) {
      a += strlen(a) + 1;
    } else if (a[0] != '-') {
      snprintf(sub, sizeof sub, "%s", a);
      break;
    }
    a += strlen(a) + 1;
  }
  return sub;
}

static void point(const char *what, const char *path) {
  if (!is_git() || (path && !strcmp(path, "/dev/null"))) return;
  int saved = errno;
  const char *counter = getenv("VSTACK_POINTS");
  int fd = raw_open(counter, O_RDWR | O_CREAT, 0644);
  if (fd < 0) { errno = saved; return; }
  flock(fd, LOCK_EX);
  char buf[32] = {0};
  long n = 0;
  if (pread(fd, buf, sizeof buf - 1, 0) > 0) n = atol(buf);
  n++;
  int len = snprintf(buf, sizeof buf, "%ld\n", n);
  pwrite(fd, buf, len, 0);
  ftruncate(fd, len);
  const char *log = getenv("VSTACK_POINTS_LOG");
  if (log) {
    int lf = raw_open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (lf >= 0) {
      char line[4096];
      int k = snprintf(line, sizeof line, "%ld git-%s %s %s\n", n, subcommand(), what,
                       path ? path : "");
      if (k > 0) write(lf, line, k < (int)sizeof line ? k : (int)sizeof line - 1);
      close(lf);
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  const char *at = getenv("VSTACK_POINT_AT");
  if (at && atol(at) == n) {
    kill(0, SIGINT); /* the whole process group, this git included */
  }
  errno = saved;
}

#define REAL(name) static __typeof__(name) *real_##name; \
  if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

static int writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0; }

int open(const char *p, int flags, ...) {
  REAL(open);
  int mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); mode = va_arg(a, int); va_end(a); }
  int r = real_open(p, flags, mode);
  if (r >= 0 && writes(flags)) point("open", p);
  return r;
}

int open64(const char *p, int flags, ...) {
  REAL(open64);
  int mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); mode = va_arg(a, int); va_end(a); }
  int r = real_open64(p, flags, mode);
  if (r >= 0 && writes(flags)) point("open", p);
  return r;
}

int openat(int d, const char *p, int flags, ...) {
  REAL(openat);
  int mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); mode = va_arg(a, int); va_end(a); }
  int r = real_openat(d, p, flags, mode);
  if (r >= 0 && writes(flags)) point("open", p);
  return r;
}

FILE *fopen(const char *p, const char *m) {
  REAL(fopen);
  FILE *r = real_fopen(p, m);
  if (r && strpbrk(m, "wa+")) point("fopen", p);
  return r;
}

FILE *fopen64(const char *p, const char *m) {
  REAL(fopen64);
  FILE *r = real_fopen64(p, m);
  if (r && strpbrk(m, "wa+")) point("fopen", p);
  return r;
}

int rename(const char *a, const char *b) {
  REAL(rename);
  int r = real_rename(a, b);
  if (r == 0) point("rename", b);
  return r;
}

int unlink(const char *p) {
  REAL(unlink);
  int r = real_unlink(p);
  if (r == 0) point("unlink", p);
  return r;
}

int rmdir(const char *p) {
  REAL(rmdir);
  int r = real_rmdir(p);
  if (r == 0) point("rmdir", p);
  return r;
}

int mkdir(const char *p, mode_t m) {
  REAL(mkdir);
  int r = real_mkdir(p, m);
  if (r == 0) point("mkdir", p);
  return r;
}

int link(const char *a, const char *b) {
  REAL(link);
  int r = real_link(a, b);
  if (r == 0) point("link", b);
  return r;
}

int symlink(const char *a, const char *b) {
  REAL(symlink);
  int r = real_symlink(a, b);
  if (r == 0) point("symlink", b);
  return r;
}
