/* The checks the C consumers count: each prints its failures and ends with
 * "c flow: P passed, F failed" (scripts/test.sh adds those up). */
#ifndef VOLMGR_TEST_CHECK_H
#define VOLMGR_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

#include "volmgr.h"

static int passed, failed;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (cond) {                                                              \
      passed++;                                                              \
    } else {                                                                 \
      failed++;                                                              \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, " (last error: %s)\n",                                 \
              volmgr_last_error() ? volmgr_last_error() : "none");           \
    }                                                                        \
  } while (0)

#define EXPECT(call, status) CHECK((call) == (status), "%s", #call)

/* Counts the mounts on PATH (a stacked mount counts twice). */
static inline int mount_count(const char *path) {
  FILE *f = fopen("/proc/self/mountinfo", "r");
  char line[8192];
  int count = 0;
  size_t n = strlen(path);
  if (f == NULL) {
    return -1;
  }
  while (fgets(line, sizeof line, f) != NULL) {
    char *p = line;
    for (int i = 0; i < 4 && p != NULL; i++) {
      p = strchr(p, ' ');
      if (p != NULL) p++;
    }
    if (p != NULL && strncmp(p, path, n) == 0 && p[n] == ' ') {
      count++;
    }
  }
  fclose(f);
  return count;
}

#endif
