/*
 * User-space instructions per volume through the C ABI, counted by
 * callgrind (tests/c/instructions.sh runs it): for each pod, one after the
 * other, volmgr_pod_upsert of a pod with one emptyDir{medium: Memory} ->
 * volmgr_wait_for_attach_and_mount -> volmgr_pod_delete ->
 * volmgr_wait_for_unmount, then until its directory is gone. Callgrind's
 * counts are dumped after start-up (volmgr_new to volmgr_sources_ready)
 * and after a storm of SMALL pods then of LARGE pods: per volume is the
 * slope between the two storms, so what a storm costs once cancels out.
 * Every thread of libvolmgr is counted, this program's loop too (a few
 * hundred instructions per pod). Mounts for real: run it in a private
 * mount namespace.
 *   instructions ROOT_DIR
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "volmgr.h"

enum { SMALL = 20, LARGE = 60 };

/* Whether ROOT_DIR/pods has nothing left in it (or is not there). */
static int pods_gone(const char *root) {
  char path[1024];
  snprintf(path, sizeof path, "%s/pods", root);
  DIR *d = opendir(path);
  if (d == NULL) return 1;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n == 0;
}

/* One pod through its life; 0 when every step answered VOLMGR_OK. */
static int one_pod(volmgr *vm, const char *root, int i) {
  char uid[64], pod[1024];
  snprintf(uid, sizeof uid, "uid-%05d", i);
  snprintf(pod, sizeof pod,
           "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p%d\",\"namespace\":\"bench\","
           "\"uid\":\"%s\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i\",\"volumeMounts\":"
           "[{\"name\":\"cache\",\"mountPath\":\"/cache\"}]}],\"volumes\":[{\"name\":\"cache\",\"emptyDir\":"
           "{\"medium\":\"Memory\",\"sizeLimit\":\"16Mi\"}}]}}",
           i, uid);
  if (volmgr_pod_upsert(vm, pod) != VOLMGR_OK || volmgr_wait_for_attach_and_mount(vm, uid, 60000) != VOLMGR_OK ||
      volmgr_pod_delete(vm, uid) != VOLMGR_OK || volmgr_wait_for_unmount(vm, uid, 60000) != VOLMGR_OK) {
    fprintf(stderr, "pod %s: %s\n", uid, volmgr_last_error());
    return 1;
  }
  struct timespec ms = {0, 1000000};
  for (int w = 0; w < 60000 && !pods_gone(root); w++) nanosleep(&ms, NULL);
  return pods_gone(root) ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ROOT_DIR\n", argv[0]);
    return 2;
  }
  char config[1024];
  snprintf(config, sizeof config, "{\"root_dir\":\"%s\",\"tracer\":\"off\"}", argv[1]);
  volmgr *vm = NULL;
  if (volmgr_new(config, &vm) != VOLMGR_OK || volmgr_start(vm) != VOLMGR_OK || volmgr_sources_ready(vm) != VOLMGR_OK) {
    fprintf(stderr, "start: %s\n", volmgr_last_error());
    return 1;
  }
  CALLGRIND_DUMP_STATS_AT("start");
  for (int i = 0; i < SMALL; i++)
    if (one_pod(vm, argv[1], i)) return 1;
  CALLGRIND_DUMP_STATS_AT("small");
  for (int i = 0; i < LARGE; i++)
    if (one_pod(vm, argv[1], SMALL + i)) return 1;
  CALLGRIND_DUMP_STATS_AT("large");
  volmgr_free(vm);
  printf("SMALL=%d LARGE=%d\n", SMALL, LARGE);
  return 0;
}
