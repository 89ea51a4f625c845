/* A wall clock off by ONCELOG_SKEW_MS milliseconds (either sign), for one process: preloaded
 * (LD_PRELOAD) into an `oncelog serve` node by the fault suite, the way libfaketime does it,
 * without depending on libfaketime being installed. Only CLOCK_REALTIME moves (what
 * SystemTime::now reads: leases, expiries, token times); monotonic clocks (Instant, timers)
 * stay true, as on a machine whose NTP is wrong. Built by the suite with the system's cc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static long long offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void skew_init(void) {
  const char *ms = getenv("ONCELOG_SKEW_MS");
  offset_ns = ms ? atoll(ms) * 1000000LL : 0;
  real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  if (!real_clock_gettime) skew_init();
  int r = real_clock_gettime(clock, ts);
  if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
      ts->tv_nsec += 1000000000LL;
      ts->tv_sec -= 1;
    }
  }
  return r;
}
