/*
 * The restart rule from C, as a kubelet fork lives it: a first process
 * creates a manager with only "root_dir", mounts a pod's volume and dies
 * (no stop, no free); the next one, with the defaults, tears nothing down
 * before volmgr_sources_ready, then adopts the volume with the same mount;
 * with "wait_for_sources_ready": false, the volume of a pod not upserted is
 * torn down at start. Run it inside a private mount namespace
 * (tests/c/run.sh does).
 *   restart ROOT_DIR
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "volmgr.h"

#include "check.h"

#define UID "restart-1"

static const char *POD =
    "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"r\",\"namespace\":\"c\",\"uid\":\"" UID "\"},"
    "\"spec\":{\"containers\":[{\"name\":\"c\",\"volumeMounts\":[{\"name\":\"m\",\"mountPath\":\"/m\"}]}],"
    "\"volumes\":[{\"name\":\"m\",\"emptyDir\":{\"medium\":\"Memory\"}}]}}";

static void volume_path(char *buf, size_t len, const char *root) {
  snprintf(buf, len, "%s/pods/" UID "/volumes/kubernetes.io~empty-dir/m", root);
}

/* The mount ID of the mount on PATH (-1 when none). */
static long mount_id(const char *path) {
  FILE *f = fopen("/proc/self/mountinfo", "r");
  char line[8192];
  long id = -1;
  size_t n = strlen(path);
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) != NULL) {
    char *p = line;
    for (int i = 0; i < 4 && p != NULL; i++) {
      p = strchr(p, ' ');
      if (p != NULL) p++;
    }
    if (p != NULL && strncmp(p, path, n) == 0 && p[n] == ' ') id = strtol(line, NULL, 10);
  }
  fclose(f);
  return id;
}

static void sleep_ms(long ms) {
  nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000}, NULL);
}

/* Forks the first process (before the parent has any thread): a manager
 * with only root_dir mounts the pod's volume, writes a file into it, and
 * the process exits without stopping or freeing anything. */
static void first_process(const char *root) {
  pid_t pid = fork();
  if (pid == 0) {
    char config[1100], path[1200];
    volmgr *vm = NULL;
    snprintf(config, sizeof config, "{\"root_dir\":\"%s\"}", root);
    if (volmgr_new(config, &vm) != VOLMGR_OK || volmgr_start(vm) != VOLMGR_OK ||
        volmgr_pod_upsert(vm, POD) != VOLMGR_OK || volmgr_wait_for_attach_and_mount(vm, UID, 20000) != VOLMGR_OK) {
      fprintf(stderr, "first process: %s\n", volmgr_last_error());
      _exit(1);
    }
    volume_path(path, sizeof path, root);
    strncat(path, "/data", sizeof path - strlen(path) - 1);
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs("kept", f) < 0 || fclose(f) != 0) _exit(1);
    _exit(0);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the first process for %s mounted and exited", root);
}

/* With the defaults: nothing torn down before volmgr_sources_ready; then
 * the upserted pod's volume is adopted, same mount, same data. */
static void with_the_defaults(const char *root) {
  char config[1100], vol[1200], data[1300], text[16] = {0};
  char *out = NULL;
  volmgr *vm = NULL;
  bool has = false;
  volume_path(vol, sizeof vol, root);
  long id = mount_id(vol);
  CHECK(id >= 0, "%s is mounted by the first process", vol);
  snprintf(config, sizeof config, "{\"root_dir\":\"%s\"}", root);
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  if (vm == NULL) return;
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, UID, &has), VOLMGR_OK);
  CHECK(has, "the volume is found at start");
  /* The old default tore it down at the first reconcile, right after
   * volmgr_start: give that every chance to happen. */
  sleep_ms(3000);
  CHECK(mount_count(vol) == 1 && mount_id(vol) == id, "before sources ready: %d mounts, id %ld (was %ld)",
        mount_count(vol), mount_id(vol), id);
  CHECK(!volmgr_reconciler_states_synced(vm), "not synced before the sources are ready");
  EXPECT(volmgr_get_volumes_in_use(vm, &out), VOLMGR_ERR_BUSY);
  EXPECT(volmgr_pod_upsert(vm, POD), VOLMGR_OK);
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, UID, 20000), VOLMGR_OK);
  for (int i = 0; i < 20000 && !volmgr_reconciler_states_synced(vm); i++) sleep_ms(1);
  CHECK(volmgr_reconciler_states_synced(vm), "synced once the sources are ready");
  CHECK(mount_count(vol) == 1 && mount_id(vol) == id, "adopted: %d mounts, id %ld (was %ld)", mount_count(vol),
        mount_id(vol), id);
  snprintf(data, sizeof data, "%s/data", vol);
  FILE *f = fopen(data, "r");
  if (f != NULL) {
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
  }
  CHECK(strcmp(text, "kept") == 0, "the volume's data: %s", text);
  EXPECT(volmgr_get_volumes_in_use(vm, &out), VOLMGR_OK);
  CHECK(out != NULL && strcmp(out, "[]") == 0, "nothing attachable in use: %s", out ? out : "(null)");
  volmgr_string_free(out);
  EXPECT(volmgr_pod_delete(vm, UID), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, UID, 20000), VOLMGR_OK);
  CHECK(mount_count(vol) == 0, "%s unmounted once the pod is deleted", vol);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
}

/* With the explicit opt-out: the old behaviour, the volume of a pod not
 * upserted is torn down at start. */
static void without_waiting(const char *root) {
  char config[1100], vol[1200];
  volmgr *vm = NULL;
  volume_path(vol, sizeof vol, root);
  CHECK(mount_count(vol) == 1, "%s is mounted by the first process", vol);
  snprintf(config, sizeof config, "{\"root_dir\":\"%s\",\"wait_for_sources_ready\":false}", root);
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  if (vm == NULL) return;
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  for (int i = 0; i < 20000 && mount_count(vol) != 0; i++) sleep_ms(1);
  CHECK(mount_count(vol) == 0, "%s torn down", vol);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ROOT_DIR\n", argv[0]);
    return 2;
  }
  char defaults[1024], opt_out[1024];
  snprintf(defaults, sizeof defaults, "%s/defaults", argv[1]);
  snprintf(opt_out, sizeof opt_out, "%s/opt-out", argv[1]);
  /* Both first processes before this one starts any thread. */
  first_process(defaults);
  first_process(opt_out);
  with_the_defaults(defaults);
  without_waiting(opt_out);
  printf("c flow: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
