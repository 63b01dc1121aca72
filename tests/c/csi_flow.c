/*
 * CSI through the C ABI, with a real driver: the in-repo test driver
 * (loop device + ext4) registers through ROOT/plugins_registry as
 * node-driver-registrar would, and a pod's inline CSI volume is staged,
 * published, unpublished and unstaged through `volmgr_new`'s "csi" config.
 * A reboot in the middle (the handle gone, every mount under ROOT and the
 * driver's loop devices gone, files kept; the driver back in a mode that
 * publishes from the staging path without checking) must stage again
 * before publishing: the file written before is there after.
 * Run it inside a private mount namespace (tests/c/run.sh does).
 *   csi_flow ROOT_DIR DRIVER_BIN STATE_DIR
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "volmgr.h"

#include "check.h"

#define DRIVER "loop.csi.volmgr.dev"

/* Starts the driver serving its CSI socket and the registration API in
 * ROOT/plugins_registry (UNCHECKED: publishing from the staging path
 * without checking it is staged); returns its pid (or -1). */
static pid_t start_driver(const char *bin, const char *root, const char *state, int unchecked) {
  char endpoint[1024], registry[1024];
  snprintf(endpoint, sizeof endpoint, "%s/csi.sock", state);
  snprintf(registry, sizeof registry, "%s/plugins_registry", root);
  pid_t pid = fork();
  if (pid == 0) {
    execl(bin, bin, "--endpoint", endpoint, "--state-dir", state, "--registration-dir", registry,
          "--node-id", "c-node", unchecked ? "--publish-without-stage-check" : (char *)NULL,
          (char *)NULL);
    perror("execl");
    _exit(127);
  }
  return pid;
}

/* Unmounts every mount below ROOT, deepest first, lazily (what a reboot
 * leaves: no mount, the files kept). Returns how many are left. */
static int unmount_below(const char *root) {
  size_t n = strlen(root);
  for (int pass = 0; pass < 16; pass++) {
    static char points[512][1024];
    int count = 0;
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[8192];
    if (f == NULL) return -1;
    while (count < 512 && fgets(line, sizeof line, f) != NULL) {
      char *p = line;
      for (int i = 0; i < 4 && p != NULL; i++) {
        p = strchr(p, ' ');
        if (p != NULL) p++;
      }
      char *end = p ? strchr(p, ' ') : NULL;
      if (end == NULL || (size_t)(end - p) <= n || strncmp(p, root, n) != 0 || p[n] != '/') continue;
      snprintf(points[count++], sizeof points[0], "%.*s", (int)(end - p), p);
    }
    fclose(f);
    if (count == 0) return 0;
    /* Deepest (longest) first. */
    for (int depth = 1024; depth > 0 && count > 0; depth--) {
      for (int i = 0; i < count; i++) {
        if ((int)strlen(points[i]) == depth) umount2(points[i], MNT_DETACH);
      }
    }
  }
  return 1;
}

/* How many calls of METHOD the driver journalled with code OK. */
static int driver_calls(const char *state, const char *method) {
  char path[1024], line[4096], want[256];
  snprintf(path, sizeof path, "%s/calls.jsonl", state);
  snprintf(want, sizeof want, "\"method\":\"%s\"", method);
  FILE *f = fopen(path, "r");
  int count = 0;
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, want) != NULL && strstr(line, "\"code\":\"OK\"") != NULL) count++;
  }
  fclose(f);
  return count;
}

/* Bad "csi" settings are refused with a clear error. */
static void bad_configs(const char *root) {
  char config[2048];
  volmgr *vm = NULL;
  const char *bad[] = {
      "\"csi\":{\"timeout_ms\":0}",
      "\"csi\":{\"drivers\":{\"d\":\"relative.sock\"}}",
      "\"csi\":{\"drivers\":{\"\":\"/x.sock\"}}",
      "\"csi\":{\"bogus\":true}",
      "\"csi\":{\"drivers\":[\"d\"]}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(config, sizeof config, "{\"root_dir\":\"%s\",\"tracer\":\"off\",%s}", root, bad[i]);
    vm = NULL;
    EXPECT(volmgr_new(config, &vm), VOLMGR_ERR_INVALID_ARGUMENT);
    CHECK(vm == NULL, "no handle for %s", bad[i]);
    CHECK(volmgr_last_error() != NULL && (strstr(volmgr_last_error(), "csi") != NULL ||
                                          strstr(volmgr_last_error(), "config_json") != NULL),
          "a clear error for %s", bad[i]);
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s ROOT_DIR DRIVER_BIN STATE_DIR\n", argv[0]);
    return 2;
  }
  const char *root = argv[1], *bin = argv[2], *state = argv[3];
  char config[2048], registry[1024], target[2048], file[2200], *out = NULL;
  bad_configs(root);

  snprintf(config, sizeof config,
           "{\"root_dir\":\"%s\",\"tracer\":\"off\",\"node_name\":\"c-node\","
           "\"csi\":{\"watch_plugins_registry\":true,\"timeout_ms\":30000}}",
           root);
  volmgr *vm = NULL;
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  if (vm == NULL) goto done;
  snprintf(registry, sizeof registry, "%s/plugins_registry", root);
  struct stat st;
  CHECK(stat(registry, &st) == 0 && S_ISDIR(st.st_mode), "volmgr_new created %s", registry);
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);
  pid_t driver = start_driver(bin, root, state, 0);
  CHECK(driver > 0, "driver started");

  /* The pod first: its claim is not there until the objects come, as a
   * kubelet fork's informers would forward them; until then it is the
   * kubelet's pod error, which ends the wait at once with its text. */
  const char *pod =
      "{\"apiVersion\":\"v1\",\"kind\":\"Pod\","
      "\"metadata\":{\"name\":\"csi-pod\",\"namespace\":\"c\",\"uid\":\"csi-1\"},"
      "\"spec\":{\"securityContext\":{\"fsGroup\":4242},"
      "\"containers\":[{\"name\":\"c\",\"volumeMounts\":[{\"name\":\"data\",\"mountPath\":\"/d\"}]}],"
      "\"volumes\":[{\"name\":\"data\",\"persistentVolumeClaim\":{\"claimName\":\"claim\"}}]}}";
  EXPECT(volmgr_pod_upsert(vm, pod), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "csi-1", 200), VOLMGR_ERR_POD_VOLUME_ERRORS);
  CHECK(strstr(volmgr_last_error(), "PersistentVolumeClaim c/claim not found") != NULL, "names its claim: %s",
        volmgr_last_error());
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"v1\",\"kind\":\"PersistentVolumeClaim\","
                                  "\"metadata\":{\"name\":\"claim\",\"namespace\":\"c\"},"
                                  "\"spec\":{\"volumeName\":\"pv-c\",\"accessModes\":[\"ReadWriteOnce\"]}}"),
         VOLMGR_OK);
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"v1\",\"kind\":\"PersistentVolume\","
                                  "\"metadata\":{\"name\":\"pv-c\"},\"spec\":{\"capacity\":{\"storage\":\"64Mi\"},"
                                  "\"accessModes\":[\"ReadWriteOnce\"],"
                                  "\"claimRef\":{\"namespace\":\"c\",\"name\":\"claim\"},"
                                  "\"csi\":{\"driver\":\"" DRIVER "\",\"volumeHandle\":\"vol-c\","
                                  "\"fsType\":\"ext4\",\"volumeAttributes\":{\"size\":\"64Mi\"}}}}"),
         VOLMGR_OK);
  /* The driver registers meanwhile: the volume is staged, published and
   * given the pod's fsGroup (ReadWriteOnce ext4, no CSIDriver object). */
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "csi-1", 60000), VOLMGR_OK);
  snprintf(target, sizeof target, "%s/pods/csi-1/volumes/kubernetes.io~csi/pv-c/mount", root);
  CHECK(mount_count(target) == 1, "%s is mounted once", target);
  CHECK(stat(target, &st) == 0 && st.st_gid == 4242 && (st.st_mode & 02000) != 0, "fsGroup applied: gid %u mode %o",
        (unsigned)st.st_gid, (unsigned)st.st_mode);
  /* A real ext4 the pod can write to. */
  snprintf(file, sizeof file, "%s/hello", target);
  FILE *f = fopen(file, "w");
  CHECK(f != NULL && fputs("hi", f) >= 0, "write into the CSI volume");
  if (f != NULL) fclose(f);
  CHECK(driver_calls(state, "NodeStageVolume") == 1, "staged once");

  /* A reboot: the handle gone (mounts stay), the driver killed, then every
   * mount under ROOT and the driver's loop devices gone, files kept. The
   * driver comes back publishing from the staging path without a check. */
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
  kill(driver, SIGKILL);
  waitpid(driver, NULL, 0);
  CHECK(unmount_below(root) == 0, "every mount under %s gone", root);
  char detach[2048];
  snprintf(detach, sizeof detach,
           "losetup -j '%s/images/vol-c.img' | cut -d: -f1 | xargs -r -n1 losetup -d", state);
  CHECK(system(detach) == 0, "loop devices detached");
  vm = NULL;
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  if (vm == NULL) goto done;
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  driver = start_driver(bin, root, state, 1);
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"v1\",\"kind\":\"PersistentVolumeClaim\","
                                  "\"metadata\":{\"name\":\"claim\",\"namespace\":\"c\"},"
                                  "\"spec\":{\"volumeName\":\"pv-c\",\"accessModes\":[\"ReadWriteOnce\"]}}"),
         VOLMGR_OK);
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"v1\",\"kind\":\"PersistentVolume\","
                                  "\"metadata\":{\"name\":\"pv-c\"},\"spec\":{\"capacity\":{\"storage\":\"64Mi\"},"
                                  "\"accessModes\":[\"ReadWriteOnce\"],"
                                  "\"claimRef\":{\"namespace\":\"c\",\"name\":\"claim\"},"
                                  "\"csi\":{\"driver\":\"" DRIVER "\",\"volumeHandle\":\"vol-c\","
                                  "\"fsType\":\"ext4\",\"volumeAttributes\":{\"size\":\"64Mi\"}}}}"),
         VOLMGR_OK);
  EXPECT(volmgr_pod_upsert(vm, pod), VOLMGR_OK);
  /* The pod source has delivered every pod (wait_for_sources_ready is on by default). */
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "csi-1", 60000), VOLMGR_OK);
  CHECK(driver_calls(state, "NodeStageVolume") == 2, "staged again after the reboot");
  CHECK(mount_count(target) == 1, "%s is mounted once after the reboot", target);
  char back[16] = {0};
  f = fopen(file, "r");
  CHECK(f != NULL && fgets(back, sizeof back, f) != NULL && strcmp(back, "hi") == 0,
        "the file written before the reboot is there after: \"%s\"", back);
  if (f != NULL) fclose(f);

  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "csi-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, "kubernetes.io/csi") != NULL, "listed as a CSI volume: %s",
        out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  EXPECT(volmgr_status_json(vm, &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, DRIVER) != NULL, "status shows the registered driver: %s",
        out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;

  /* In use: a CSI volume from a PV is attachable (no CSIDriver object: the
   * kubelet's CanAttach says yes); once its CSIDriver says
   * attachRequired: false, it is not (bounded wait: the pod is converted
   * again when the object arrives). */
  for (int i = 0; i < 20000; i++) {
    volmgr_string_free(out);
    out = NULL;
    if (volmgr_get_volumes_in_use(vm, &out) == VOLMGR_OK) break;
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 1000000}, NULL);
  }
  CHECK(out != NULL && strcmp(out, "[\"kubernetes.io/csi/" DRIVER "^vol-c\"]") == 0, "in use: %s",
        out ? out : "(null)");
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"storage.k8s.io/v1\",\"kind\":\"CSIDriver\","
                                  "\"metadata\":{\"name\":\"" DRIVER "\"},\"spec\":{\"attachRequired\":false}}"),
         VOLMGR_OK);
  for (int i = 0; i < 20000 && out != NULL && strcmp(out, "[]") != 0; i++) {
    volmgr_string_free(out);
    out = NULL;
    EXPECT(volmgr_get_volumes_in_use(vm, &out), VOLMGR_OK);
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 1000000}, NULL);
  }
  CHECK(out != NULL && strcmp(out, "[]") == 0, "attachRequired: false, not in use: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  CHECK(mount_count(target) == 1, "%s still mounted once", target);

  /* Objects: bad ones refused without harm; deleting the claim keeps the
   * running pod's volume (last resolution). */
  EXPECT(volmgr_object_upsert(vm, "{\"kind\":\"ConfigMapX\",\"metadata\":{\"name\":\"x\"}}"),
         VOLMGR_ERR_UNSUPPORTED);
  EXPECT(volmgr_object_upsert(vm, "{\"kind\":\"Secret\",\"metadata\":{\"name\":\"s\"},\"data\":{\"k\":\"hunter2!!\"}}"),
         VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(strstr(volmgr_last_error(), "hunter2") == NULL, "a Secret's error never quotes it: %s", volmgr_last_error());
  EXPECT(volmgr_object_upsert(vm, "{\"kind\":\"PersistentVolume\",\"metadata\":{}}"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_object_upsert(vm, "not json"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_object_upsert(NULL, "{}"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_object_delete(vm, "PersistentVolumeClaim", "c", "nope"), VOLMGR_ERR_NOT_FOUND);
  EXPECT(volmgr_object_delete(vm, "Pod", "", "n"), VOLMGR_ERR_UNSUPPORTED);
  EXPECT(volmgr_object_delete(vm, "PersistentVolumeClaim", NULL, "claim"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_object_delete(vm, "PersistentVolumeClaim", "c", "claim"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "csi-1", 2000), VOLMGR_OK);
  CHECK(mount_count(target) == 1, "still mounted after its claim went away");

  EXPECT(volmgr_pod_delete(vm, "csi-1"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, "csi-1", 60000), VOLMGR_OK);
  CHECK(mount_count(target) == 0, "%s is unmounted", target);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
  if (driver > 0) {
    kill(driver, SIGTERM);
    waitpid(driver, NULL, 0);
  }
done:
  printf("c flow: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
