/*
 * A wall-clock step for one redis-server, preloaded (LD_PRELOAD) by the nemesis's
 * `redis-clock-step` fault. libfaketime 0.9.10 cannot run redis-server: jemalloc calls
 * clock_gettime while libfaketime initialises, and libfaketime aborts the process ("Unexpected
 * recursive calls to clock_gettime()"). This shim allocates nothing and calls the kernel directly.
 *
 * The offset, in ms (signed decimal), is read from the file named by SHARDGUARD_CLOCK_FILE at most
 * every 100 ms: writing the file steps the clock of the running process, as an NTP step or a VM
 * resume would. Only CLOCK_REALTIME (and its coarse variant), gettimeofday and time are moved; the
 * monotonic clocks are not (an NTP step does not move them either).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long long offset_ns = 0;
static volatile long long checked_ns = -1;

static long long monotonic_ns(void) {
  struct timespec ts;
  syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void refresh(void) {
  long long now = monotonic_ns();
  if (checked_ns >= 0 && now - checked_ns < 100000000LL) return;
  checked_ns = now;
  const char *path = getenv("SHARDGUARD_CLOCK_FILE");
  if (path == NULL) return;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
  if (fd < 0) return;
  char buf[32];
  long n = (long)syscall(SYS_read, fd, buf, sizeof(buf) - 1);
  syscall(SYS_close, fd);
  if (n <= 0) return;
  buf[n] = 0;
  long long sign = 1, value = 0;
  int i = 0;
  while (buf[i] == ' ') i++;
  if (buf[i] == '-') { sign = -1; i++; } else if (buf[i] == '+') i++;
  while (buf[i] >= '0' && buf[i] <= '9') value = value * 10 + (buf[i++] - '0');
  offset_ns = sign * value * 1000000LL;
}

static void shift(struct timespec *ts) {
  refresh();
  long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
  ts->tv_sec = ns / 1000000000LL;
  ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  int result = (int)syscall(SYS_clock_gettime, id, ts);
  if (result == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
  return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  int result = clock_gettime(CLOCK_REALTIME, &ts);
  if (result == 0 && tv != NULL) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return result;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out != NULL) *out = ts.tv_sec;
  return ts.tv_sec;
}
