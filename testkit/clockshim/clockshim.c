/* A wall clock that steps on demand, for tests: preloaded into a server (LD_PRELOAD), it adds an
 * offset in microseconds to CLOCK_REALTIME, gettimeofday() and time(), read from the file named
 * by DLOCK_CLOCK_OFFSET_FILE (one signed decimal integer; re-read at most every 2 ms). The
 * monotonic clocks pass through untouched, unless DLOCK_CLOCK_STEP_MONOTONIC=1 is set too: then
 * CLOCK_MONOTONIC steps with the wall clock (never on a real machine; the self-check of the tests
 * that leases follow the monotonic clock).
 *
 * It calls the kernel directly (no dlsym, no allocation), so it is safe inside malloc
 * implementations that read the clock while the process starts (jemalloc does). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t offset_us;
static volatile int64_t next_read_ns;
static volatile int step_monotonic = -1;

static int kernel_clock(clockid_t clock, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static int64_t parse(const char *s) {
    int64_t sign = 1, v = 0;
    while (*s == ' ' || *s == '\n') s++;
    if (*s == '-') { sign = -1; s++; } else if (*s == '+') { s++; }
    while (*s >= '0' && *s <= '9') { v = v * 10 + (*s - '0'); s++; }
    return sign * v;
}

static int64_t offset(void) {
    struct timespec m;
    kernel_clock(CLOCK_MONOTONIC, &m);
    int64_t now = (int64_t)m.tv_sec * 1000000000 + m.tv_nsec;
    if (now >= next_read_ns) {
        next_read_ns = now + 2000000;
        if (step_monotonic < 0) {
            const char *flag = getenv("DLOCK_CLOCK_STEP_MONOTONIC");
            step_monotonic = flag != NULL && flag[0] == '1';
        }
        const char *path = getenv("DLOCK_CLOCK_OFFSET_FILE");
        if (path != NULL) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                char buf[32];
                ssize_t n = read(fd, buf, sizeof buf - 1);
                close(fd);
                if (n > 0) {
                    buf[n] = 0;
                    offset_us = parse(buf);
                }
            }
        }
    }
    return offset_us;
}

static void shift(struct timespec *ts, int64_t us) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + us * 1000;
    ts->tv_sec = (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000; ts->tv_sec -= 1; }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = kernel_clock(clock, ts);
    if (rc != 0) return rc;
    int wall = clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE;
    int64_t us = offset();
    if (wall || (step_monotonic == 1 && (clock == CLOCK_MONOTONIC || clock == CLOCK_MONOTONIC_RAW
                                          || clock == CLOCK_MONOTONIC_COARSE
                                          || clock == CLOCK_BOOTTIME))) {
        shift(ts, us);
    }
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
