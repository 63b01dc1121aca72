/*
 * Per-call cost of the C ABI: volmgr_get_mounted_volumes_for_pod for a pod
 * with 10 mounted volumes (including the volmgr_string_free), and
 * volmgr_pod_upsert of an unchanged pod. Mounts for real: run it in a
 * private mount namespace (tests/c/bench.sh does).
 *   bench ROOT_DIR HOST_DIR
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "volmgr.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROOT_DIR HOST_DIR\n", argv[0]);
    return 2;
  }
  char config[1024], pod[8192], mounts[4096] = "", vols[4096] = "";
  snprintf(config, sizeof config, "{\"root_dir\":\"%s\",\"tracer\":\"off\"}", argv[1]);
  for (int i = 0; i < 10; i++) {
    char m[128], v[256];
    snprintf(m, sizeof m, "%s{\"name\":\"m%d\",\"mountPath\":\"/m%d\"}", i ? "," : "", i, i);
    if (i == 0) {
      snprintf(v, sizeof v, "{\"name\":\"m0\",\"hostPath\":{\"path\":\"%s\",\"type\":\"Directory\"}}", argv[2]);
    } else {
      snprintf(v, sizeof v, ",{\"name\":\"m%d\",\"emptyDir\":{\"medium\":\"Memory\"}}", i);
    }
    strcat(mounts, m);
    strcat(vols, v);
  }
  snprintf(pod, sizeof pod,
           "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"bench\",\"uid\":\"bench\"},"
           "\"spec\":{\"containers\":[{\"name\":\"c\",\"volumeMounts\":[%s]}],\"volumes\":[%s]}}",
           mounts, vols);
  volmgr *vm = NULL;
  if (volmgr_new(config, &vm) != VOLMGR_OK || volmgr_start(vm) != VOLMGR_OK ||
      volmgr_pod_upsert(vm, pod) != VOLMGR_OK || volmgr_wait_for_attach_and_mount(vm, "bench", 20000) != VOLMGR_OK) {
    fprintf(stderr, "setup failed: %s\n", volmgr_last_error());
    return 1;
  }
  enum { ROUNDS = 7, CALLS = 20000 };
  double read_ns[ROUNDS], upsert_ns[ROUNDS], miss_ns[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < CALLS; i++) {
      char *out = NULL;
      if (volmgr_get_mounted_volumes_for_pod(vm, "bench", &out) != VOLMGR_OK || out == NULL) return 1;
      volmgr_string_free(out);
    }
    double t1 = now_ns();
    for (int i = 0; i < CALLS; i++) {
      if (volmgr_pod_upsert(vm, pod) != VOLMGR_OK) return 1;
    }
    double t2 = now_ns();
    /* Every upsert counts as a change, so each read after it rebuilds the list. */
    for (int i = 0; i < CALLS; i++) {
      char *out = NULL;
      if (volmgr_pod_upsert(vm, pod) != VOLMGR_OK) return 1;
      if (volmgr_get_mounted_volumes_for_pod(vm, "bench", &out) != VOLMGR_OK || out == NULL) return 1;
      volmgr_string_free(out);
    }
    double t3 = now_ns();
    read_ns[r] = (t1 - t0) / CALLS;
    upsert_ns[r] = (t2 - t1) / CALLS;
    miss_ns[r] = (t3 - t2) / CALLS - upsert_ns[r];
  }
  qsort(read_ns, ROUNDS, sizeof(double), cmp);
  qsort(upsert_ns, ROUNDS, sizeof(double), cmp);
  qsort(miss_ns, ROUNDS, sizeof(double), cmp);
  printf("C: volmgr_get_mounted_volumes_for_pod (10 volumes): median %.0f ns/call (min %.0f, max %.0f)\n",
         read_ns[ROUNDS / 2], read_ns[0], read_ns[ROUNDS - 1]);
  printf("C: volmgr_pod_upsert (unchanged pod): median %.0f ns/call (min %.0f, max %.0f)\n", upsert_ns[ROUNDS / 2],
         upsert_ns[0], upsert_ns[ROUNDS - 1]);
  printf("C: volmgr_get_mounted_volumes_for_pod right after a change (list rebuilt): median %.0f ns/call\n",
         miss_ns[ROUNDS / 2]);
  volmgr_free(vm);
  return 0;
}
