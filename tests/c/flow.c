/*
 * The full volmgr flow from C, with real mounts: run it inside a private
 * mount namespace (tests/c/run.sh does, under valgrind).
 *   flow ROOT_DIR HOST_DIR
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>

#include "volmgr.h"

#include "check.h"

static atomic_int events;

static void on_event(void *userdata, const char *event_json) {
  (void)userdata;
  if (strstr(event_json, "\"kind\"") != NULL) {
    atomic_fetch_add(&events, 1);
  }
}

/* Whether PATH is a mount point in this process's mount table. */
static int mounted(const char *path) { return mount_count(path) > 0; }

static _Thread_local char pod_json[4096];

static const char *make_pod(const char *uid, const char *host_dir, const char *host_type) {
  snprintf(pod_json, sizeof pod_json,
           "{\"apiVersion\":\"v1\",\"kind\":\"Pod\","
           "\"metadata\":{\"name\":\"p-%s\",\"namespace\":\"c\",\"uid\":\"%s\"},"
           "\"spec\":{\"securityContext\":{\"fsGroup\":1234,\"supplementalGroups\":[5,6]},"
           "\"containers\":[{\"name\":\"c\",\"volumeMounts\":["
           "{\"name\":\"cache\",\"mountPath\":\"/cache\"},{\"name\":\"host\",\"mountPath\":\"/host\"}]}],"
           "\"volumes\":[{\"name\":\"cache\",\"emptyDir\":{\"medium\":\"Memory\",\"sizeLimit\":\"8Mi\"}},"
           "{\"name\":\"host\",\"hostPath\":{\"path\":\"%s\",\"type\":\"%s\"}}]}}",
           uid, uid, host_dir, host_type);
  return pod_json;
}

/* With TRACER, a volume unmounted by the host process itself (this thread,
 * not one of volmgr's) is found and mounted again without waiting for the
 * resync (one hour here), and the status document shows it. */
static void out_of_band(const char *root, const char *host, const char *tracer) {
  char dir[1024], config[2048], path[2048];
  volmgr *vm = NULL;
  char *out = NULL;
  snprintf(dir, sizeof dir, "%s/oob-%s", root, tracer);
  CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
  snprintf(config, sizeof config,
           "{\"root_dir\":\"%s\",\"tracer\":\"%s\",\"resync_period_ms\":3600000}", dir, tracer);
  volmgr_status st = volmgr_new(config, &vm);
  if (st == VOLMGR_ERR_UNSUPPORTED && strcmp(tracer, "ebpf") == 0) {
    printf("SKIP c out-of-band with the eBPF tracer: %s\n", volmgr_last_error());
    return;
  }
  EXPECT(st, VOLMGR_OK);
  if (vm == NULL) return;
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);
  EXPECT(volmgr_pod_upsert(vm, make_pod("oob", host, "Directory")), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "oob", 20000), VOLMGR_OK);
  snprintf(path, sizeof path, "%s/pods/oob/volumes/kubernetes.io~empty-dir/cache", dir);
  CHECK(mount_count(path) == 1, "%s is mounted", path);
  CHECK(umount2(path, 0) == 0, "umount2 %s", path);
  /* Bounded wait (20 s) that only catches a hang. */
  int found = 0;
  for (int i = 0; i < 20000 && !found; i++) {
    EXPECT(volmgr_status_json(vm, &out), VOLMGR_OK);
    found = out != NULL && strstr(out, "\"kind\":\"lost\"") != NULL &&
            strstr(out, "\"outcome\":\"repaired\"") != NULL && mount_count(path) == 1;
    if (!found && i < 19999) {
      volmgr_string_free(out);
      out = NULL;
      nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 1000000}, NULL);
    }
  }
  CHECK(found, "%s tracer: the volume was mounted again and status shows it: %s", tracer, out ? out : "(null)");
  char want[64];
  snprintf(want, sizeof want, "\"tracer\":\"%s\"", tracer);
  CHECK(out != NULL && strstr(out, want) != NULL, "status names the tracer: %s", out ? out : "(null)");
  CHECK(out != NULL && strstr(out, "\"detected_by\":\"") != NULL, "status: %s", out ? out : "(null)");
  /* Under tests/c/older_kernel (no openat2), paths are opened by the walk. */
  const char *resolution = getenv("VOLMGR_C_EXPECT_OPENAT_WALK") ? "\"path_resolution\":\"openat walk\""
                                                                 : "\"path_resolution\":\"openat2\"";
  CHECK(out != NULL && strstr(out, resolution) != NULL, "status shows %s: %s", resolution, out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  EXPECT(volmgr_pod_delete(vm, "oob"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, "oob", 20000), VOLMGR_OK);
  CHECK(mount_count(path) == 0, "%s is unmounted", path);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
}

/* A host plugin: handles nfs volumes (which volmgr has no plugin for) by
 * writing the spec to a file. */
struct fake_plugin {
  atomic_int setups, teardowns, fail_next;
};

static bool fp_can_support(void *userdata, const char *spec_json) {
  (void)userdata;
  return strstr(spec_json, "\"nfs\"") != NULL;
}

static volmgr_status fp_set_up(void *userdata, const char *spec_json, const char *target_dir, char *err,
                               size_t err_len) {
  struct fake_plugin *p = userdata;
  char path[4096];
  if (atomic_fetch_sub(&p->fail_next, 1) > 0) {
    snprintf(err, err_len, "injected failure");
    return VOLMGR_ERR_INTERNAL;
  }
  snprintf(path, sizeof path, "%s/spec.json", target_dir);
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    snprintf(err, err_len, "cannot write %s", path);
    return VOLMGR_ERR_INTERNAL;
  }
  fputs(spec_json, f);
  fclose(f);
  atomic_fetch_add(&p->setups, 1);
  return VOLMGR_OK;
}

static volmgr_status fp_tear_down(void *userdata, const char *target_dir, char *err, size_t err_len) {
  struct fake_plugin *p = userdata;
  char path[4096];
  (void)err;
  (void)err_len;
  snprintf(path, sizeof path, "%s/spec.json", target_dir);
  remove(path);
  atomic_fetch_add(&p->teardowns, 1);
  return VOLMGR_OK;
}

static void host_plugin(volmgr *vm, const char *root) {
  static struct fake_plugin fp;
  volmgr_plugin vt = {.name = "example.com/fake",
                      .can_support = fp_can_support,
                      .set_up = fp_set_up,
                      .tear_down = fp_tear_down};
  volmgr_plugin dup = vt;
  volmgr_plugin bad = vt;
  char path[2048], *out = NULL;
  bad.set_up = NULL;
  dup.name = "kubernetes.io/empty-dir";
  atomic_store(&fp.fail_next, 2);
  EXPECT(volmgr_register_plugin(vm, NULL, &fp), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_register_plugin(vm, &bad, &fp), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_register_plugin(vm, &dup, &fp), VOLMGR_ERR_BUSY);
  EXPECT(volmgr_register_plugin(vm, &vt, &fp), VOLMGR_OK);
  EXPECT(volmgr_register_plugin(vm, &vt, &fp), VOLMGR_ERR_BUSY);
  EXPECT(volmgr_pod_upsert(vm,
                           "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"cm\",\"uid\":\"pod-3\"},"
                           "\"spec\":{\"containers\":[{\"name\":\"c\",\"volumeMounts\":[{\"name\":\"cfg\",\"mountPath\":\"/c\"}]}],"
                           "\"volumes\":[{\"name\":\"cfg\",\"nfs\":{\"server\":\"nfs.example.com\",\"path\":\"/settings\"}}]}}"),
         VOLMGR_OK);
  /* Two injected failures, then success after the backoff. */
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "pod-3", 20000), VOLMGR_OK);
  CHECK(atomic_load(&fp.setups) == 1, "one successful set-up, got %d", atomic_load(&fp.setups));
  snprintf(path, sizeof path, "%s/pods/pod-3/volumes/example.com~fake/cfg", root);
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "pod-3", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, path) != NULL && strstr(out, "example.com/fake") != NULL, "plugin volume: %s",
        out ? out : "(null)");
  volmgr_string_free(out);
  strncat(path, "/spec.json", sizeof path - strlen(path) - 1);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "set_up wrote %s", path);
  if (f != NULL) fclose(f);
  EXPECT(volmgr_pod_delete(vm, "pod-3"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, "pod-3", 20000), VOLMGR_OK);
  CHECK(atomic_load(&fp.teardowns) == 1, "one tear-down, got %d", atomic_load(&fp.teardowns));
  CHECK(fopen(path, "r") == NULL, "volume directory removed");
}

/* A kubelet fork's TokenRequest client, as a callback. */
static atomic_int token_calls;

static int32_t give_token(void *userdata, const char *request_json, char *buf, size_t len,
                          int64_t *expiration_unix) {
  (void)userdata;
  atomic_fetch_add(&token_calls, 1);
  if (strstr(request_json, "\"service_account\":\"builder\"") == NULL ||
      strstr(request_json, "\"audience\":\"vault\"") == NULL || strstr(request_json, "\"pod_uid\":\"proj-1\"") == NULL) {
    return VOLMGR_ERR_NOT_FOUND;
  }
  snprintf(buf, len, "token-for-builder");
  *expiration_unix = (int64_t)time(NULL) + 3600;
  return VOLMGR_OK;
}

/* The standard kube-api-access volume of every API pod, from C: a token
 * from the callback, ca.crt from a ConfigMap upserted as an object, the
 * namespace from the downward API. */
static void projected(const char *root) {
  char config[1024], path[2048], text[256];
  volmgr *vm = NULL;
  snprintf(config, sizeof config, "{\"root_dir\":\"%s/projected\",\"tracer\":\"off\"}", root);
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  if (vm == NULL) return;
  EXPECT(volmgr_set_token_callback(vm, NULL, NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_set_token_callback(vm, give_token, NULL), VOLMGR_OK);
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);
  EXPECT(volmgr_object_upsert(vm, "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"kube-root-ca.crt\","
                                  "\"namespace\":\"c\"},\"data\":{\"ca.crt\":\"THE-CA\"}}"),
         VOLMGR_OK);
  EXPECT(volmgr_pod_upsert(
             vm, "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"namespace\":\"c\",\"uid\":\"proj-1\"},"
                 "\"spec\":{\"serviceAccountName\":\"builder\",\"containers\":[{\"name\":\"c\",\"volumeMounts\":[{\"name\":\"api\","
                 "\"mountPath\":\"/var/run/secrets/kubernetes.io/serviceaccount\"}]}],\"volumes\":[{\"name\":\"api\",\"projected\":{"
                 "\"sources\":[{\"serviceAccountToken\":{\"path\":\"token\",\"audience\":\"vault\",\"expirationSeconds\":3607}},"
                 "{\"configMap\":{\"name\":\"kube-root-ca.crt\",\"items\":[{\"key\":\"ca.crt\",\"path\":\"ca.crt\"}]}},"
                 "{\"downwardAPI\":{\"items\":[{\"path\":\"namespace\",\"fieldRef\":{\"fieldPath\":\"metadata.namespace\"}}]}}]}}]}}"),
         VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "proj-1", 20000), VOLMGR_OK);
  const char *files[][2] = {{"token", "token-for-builder"}, {"ca.crt", "THE-CA"}, {"namespace", "c"}};
  for (size_t i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/projected/pods/proj-1/volumes/kubernetes.io~projected/api/%s", root, files[i][0]);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK(strcmp(text, files[i][1]) == 0, "%s holds %s, got %s", files[i][0], files[i][1], text);
  }
  CHECK(atomic_load(&token_calls) >= 1, "the token came from the callback");
  /* The runtime is told it may relabel the token volume for SELinux (the
   * kubelet's projected mounter says so), as JSON and as the struct list. */
  char *out = NULL;
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "proj-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, "\"selinux_relabel\":true") != NULL, "projected relabel: %s", out ? out : "");
  volmgr_string_free(out);
  volmgr_volume_list *list = NULL;
  EXPECT(volmgr_get_volume_list_for_pod(vm, "proj-1", false, &list), VOLMGR_OK);
  CHECK(list != NULL && list->len == 1 && list->volumes[0].selinux_relabel && list->volumes[0].read_only,
        "projected volume flags");
  volmgr_volume_list_free(list);
  EXPECT(volmgr_pod_delete(vm, "proj-1"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, "proj-1", 20000), VOLMGR_OK);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  volmgr_free(vm);
}

#define THREADS 16
#define ROUNDS 40

struct worker {
  volmgr *vm;
  const char *host;
  int id;
  int errors;
};

/* Upserts, queries and deletes its own pods; the last one stays desired. */
static void *worker_main(void *arg) {
  struct worker *w = arg;
  char uid[64], *out = NULL;
  for (int r = 0; r < ROUNDS; r++) {
    snprintf(uid, sizeof uid, "t%d-r%d", w->id, r);
    if (volmgr_pod_upsert(w->vm, make_pod(uid, w->host, "Directory")) != VOLMGR_OK) w->errors++;
    if (volmgr_get_mounted_volumes_for_pod(w->vm, uid, &out) != VOLMGR_OK) w->errors++;
    volmgr_string_free(out);
    out = NULL;
    (void)volmgr_reconciler_states_synced(w->vm);
    if (r % 3 == 0 && volmgr_wait_for_attach_and_mount(w->vm, uid, 20000) != VOLMGR_OK) w->errors++;
    if (r + 1 < ROUNDS && volmgr_pod_delete(w->vm, uid) != VOLMGR_OK) w->errors++;
  }
  return NULL;
}

/* 16 threads hammer one handle; then every desired volume is mounted
 * exactly once and every deleted one is gone. */
static void thread_safety(const char *root, const char *host) {
  char config[1024], uid[64], path[2048];
  volmgr *vm = NULL;
  pthread_t th[THREADS];
  struct worker w[THREADS];
  /* No pod source: every pod is upserted here, so no need to wait for one. */
  snprintf(config, sizeof config, "{\"root_dir\":\"%s/threads\",\"wait_for_sources_ready\":false}", root);
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  for (int i = 0; i < THREADS; i++) {
    w[i] = (struct worker){.vm = vm, .host = host, .id = i, .errors = 0};
    CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    CHECK(w[i].errors == 0, "thread %d had %d failed calls", i, w[i].errors);
  }
  for (int i = 0; i < THREADS; i++) {
    snprintf(uid, sizeof uid, "t%d-r%d", i, ROUNDS - 1);
    EXPECT(volmgr_wait_for_attach_and_mount(vm, uid, 30000), VOLMGR_OK);
  }
  for (int i = 0; i < THREADS; i++) {
    for (int r = 0; r < ROUNDS; r++) {
      snprintf(uid, sizeof uid, "t%d-r%d", i, r);
      if (r + 1 < ROUNDS) {
        EXPECT(volmgr_wait_for_unmount(vm, uid, 30000), VOLMGR_OK);
      }
      snprintf(path, sizeof path, "%s/threads/pods/%s/volumes/kubernetes.io~empty-dir/cache", root, uid);
      int want = r + 1 < ROUNDS ? 0 : 1;
      CHECK(mount_count(path) == want, "%s mounted %d times, want %d", path, mount_count(path), want);
    }
  }
  volmgr_free(vm);
}

/* HasPossiblyMountedVolumesForPod, and its misuse. */
/* The struct-array form of the volume list: the same entries as the JSON,
 * sorted by name, strings in the list's arena; bad arguments refused. */
static void volume_list(volmgr *vm, const char *cache_path) {
  volmgr_volume_list *list = NULL;
  EXPECT(volmgr_get_volume_list_for_pod(vm, "pod-1", false, &list), VOLMGR_OK);
  CHECK(list != NULL && list->len == 2, "two volumes: %zu", list ? list->len : 0);
  if (list != NULL && list->len == 2) {
    const volmgr_mounted_volume *cache = &list->volumes[0], *hostv = &list->volumes[1];
    CHECK(strcmp(cache->outer_volume_spec_name, "cache") == 0, "sorted: %s", cache->outer_volume_spec_name);
    CHECK(strcmp(cache->plugin, "kubernetes.io/empty-dir") == 0, "plugin %s", cache->plugin);
    CHECK(strcmp(cache->path, cache_path) == 0, "path %s", cache->path);
    CHECK(cache->state == VOLMGR_VOLUME_MOUNTED && !cache->read_only && cache->selinux_relabel &&
              cache->block_device_path == NULL && cache->sub_paths == NULL && cache->sub_paths_len == 0,
          "cache flags");
    CHECK(strcmp(hostv->outer_volume_spec_name, "host") == 0 && strstr(hostv->path, "host") != NULL, "host %s",
          hostv->path);
    CHECK(cache->path >= list->arena && cache->path < list->arena + list->arena_len, "strings in the arena");
  }
  volmgr_volume_list_free(list);
  list = NULL;
  EXPECT(volmgr_get_volume_list_for_pod(vm, "no-such-pod", true, &list), VOLMGR_OK);
  CHECK(list != NULL && list->len == 0, "an unknown pod has no volumes");
  volmgr_volume_list_free(list);
  volmgr_volume_list_free(NULL);
  list = NULL;
  EXPECT(volmgr_get_volume_list_for_pod(vm, "../x", false, &list), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_get_volume_list_for_pod(vm, "pod-1", false, NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_get_volume_list_for_pod(NULL, "pod-1", false, &list), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(list == NULL, "out untouched on failure");
}

static void has_possibly_mounted(volmgr *vm) {
  bool has = false;
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, "pod-1", &has), VOLMGR_OK);
  CHECK(has, "pod-1 has mounted volumes");
  has = true;
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, "nobody", &has), VOLMGR_OK);
  CHECK(!has, "an unknown pod has none");
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, "pod-1", NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, NULL, &has), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(NULL, "pod-1", &has), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, "a/b", &has), VOLMGR_ERR_INVALID_ARGUMENT);
}

static unsigned long long fs_size(const char *path) {
  struct statfs st;
  if (statfs(path, &st) != 0) {
    return 0;
  }
  return (unsigned long long)st.f_blocks * (unsigned long long)st.f_bsize;
}

/* ResizeEphemeralVolume on the real 8Mi tmpfs at CACHE: grown in place
 * with its files kept, never below what it holds, other volumes refused. */
static void resize(volmgr *vm, const char *cache) {
  char file[2100];
  CHECK(fs_size(cache) == 8ull << 20, "8Mi tmpfs: %llu", fs_size(cache));
  snprintf(file, sizeof file, "%s/data", cache);
  FILE *f = fopen(file, "w");
  CHECK(f != NULL, "create %s", file);
  if (f != NULL) {
    static char block[1 << 20];
    memset(block, 7, sizeof block);
    for (int i = 0; i < 3; i++) {
      CHECK(fwrite(block, 1, sizeof block, f) == sizeof block, "write");
    }
    fclose(f);
  }
  EXPECT(volmgr_resize_ephemeral_volume(vm, "pod-1", "cache", 16ull << 20), VOLMGR_OK);
  CHECK(fs_size(cache) == 16ull << 20, "grown to 16Mi: %llu", fs_size(cache));
  struct stat st;
  CHECK(stat(file, &st) == 0 && st.st_size == 3 << 20, "files kept");
  EXPECT(volmgr_resize_ephemeral_volume(vm, "pod-1", "cache", 1ull << 20), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(strstr(volmgr_last_error(), "in use") != NULL, "below use says why: %s", volmgr_last_error());
  CHECK(fs_size(cache) == 16ull << 20, "unchanged: %llu", fs_size(cache));
  EXPECT(volmgr_resize_ephemeral_volume(vm, "pod-1", "host", 1ull << 20), VOLMGR_ERR_UNSUPPORTED);
  EXPECT(volmgr_resize_ephemeral_volume(vm, "pod-1", "nope", 1ull << 20), VOLMGR_ERR_NOT_FOUND);
  EXPECT(volmgr_resize_ephemeral_volume(vm, "nobody", "cache", 1ull << 20), VOLMGR_ERR_NOT_FOUND);
  EXPECT(volmgr_resize_ephemeral_volume(vm, "pod-1", NULL, 1ull << 20), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_resize_ephemeral_volume(vm, NULL, "cache", 1ull << 20), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_resize_ephemeral_volume(NULL, "pod-1", "cache", 1ull << 20), VOLMGR_ERR_INVALID_ARGUMENT);
  remove(file);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROOT_DIR HOST_DIR\n", argv[0]);
    return 2;
  }
  const char *root = argv[1];
  const char *host = argv[2];
  char config[1024], path[2048], missing[1024];
  volmgr *vm = NULL;
  char *out = NULL;
  bool attached = false;

  /* Misuse before there is a handle. */
  EXPECT(volmgr_new(NULL, &vm), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(volmgr_last_error() != NULL && strstr(volmgr_last_error(), "NULL") != NULL, "NULL config message");
  EXPECT(volmgr_new("{\"root_dir\":", &vm), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_new("{\"root_dir\":\"/tmp\",\"bogus\":1}", &vm), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_new("{\"root_dir\":\"/tmp\",\"tracer\":\"bogus\"}", &vm), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(strstr(volmgr_last_error(), "unknown tracer") != NULL, "unknown tracer message");
  EXPECT(volmgr_new("{\"root_dir\":\"\xff\"}", &vm), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(strstr(volmgr_last_error(), "UTF-8") != NULL, "bad UTF-8 message");
  EXPECT(volmgr_new("{\"root_dir\":\"/tmp\"}", NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(vm == NULL, "no handle written on failure");
  volmgr_free(NULL);
  volmgr_string_free(NULL);
  EXPECT(volmgr_start(NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(!volmgr_reconciler_states_synced(NULL), "NULL is not synced");

  snprintf(config, sizeof config,
           "{\"root_dir\":\"%s\",\"node_name\":\"n1\",\"tracer\":\"off\",\"backoff_initial_ms\":50,\"backoff_max_ms\":200}",
           root);
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  CHECK(vm != NULL, "handle");
  EXPECT(volmgr_set_event_callback(vm, on_event, NULL), VOLMGR_OK);
  /* Before the states have synced, no list of volumes in use to write
   * into the node status. */
  EXPECT(volmgr_get_volumes_in_use(vm, &out), VOLMGR_ERR_BUSY);
  CHECK(out == NULL && strstr(volmgr_last_error(), "not synced") != NULL, "in use before sync: %s",
        volmgr_last_error());
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  EXPECT(volmgr_start(vm), VOLMGR_ERR_BUSY);
  /* The pod sources (the pods upserted below) are ready. */
  EXPECT(volmgr_sources_ready(vm), VOLMGR_OK);

  /* A pod with a tmpfs emptyDir and a hostPath. */
  EXPECT(volmgr_pod_upsert(vm, make_pod("pod-1", host, "Directory")), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "pod-1", 20000), VOLMGR_OK);
  CHECK(volmgr_reconciler_states_synced(vm), "synced");
  snprintf(path, sizeof path, "%s/pods/pod-1/volumes/kubernetes.io~empty-dir/cache", root);
  CHECK(mounted(path) == 1, "%s is mounted", path);
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "pod-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, path) != NULL && strstr(out, host) != NULL && strstr(out, "\"mounted\"") != NULL,
        "mounted volumes: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  EXPECT(volmgr_get_possibly_mounted_volumes_for_pod(vm, "pod-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, "kubernetes.io/empty-dir") != NULL, "possibly mounted: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  /* No PersistentVolume with a GID annotation: no extra group (the pod's
   * own fsGroup and supplementalGroups are not "extra"). */
  EXPECT(volmgr_get_extra_supplemental_groups_for_pod(vm, "pod-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strcmp(out, "[]") == 0, "groups: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  /* emptyDir and hostPath are not attachable: not in use. */
  EXPECT(volmgr_get_volumes_in_use(vm, &out), VOLMGR_OK);
  CHECK(out != NULL && strcmp(out, "[]") == 0, "in use: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "pod-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, "\"selinux_relabel\":true") != NULL && strstr(out, "\"read_only\":false") != NULL &&
            strstr(out, "\"block_device_path\":null") != NULL,
        "volume map fields: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  volume_list(vm, path);
  has_possibly_mounted(vm);
  resize(vm, path);
  EXPECT(volmgr_mark_volumes_as_reported_in_use(vm, "[\"kubernetes.io/empty-dir/pod-1-cache\"]"), VOLMGR_OK);
  EXPECT(volmgr_mark_volumes_as_reported_in_use(vm, "{\"not\":\"a list\"}"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_volume_is_attached(vm, "kubernetes.io/empty-dir/pod-1-cache", &attached), VOLMGR_OK);
  CHECK(attached, "attached");
  EXPECT(volmgr_volume_is_attached(vm, "nope", &attached), VOLMGR_OK);
  CHECK(!attached, "unknown volume not attached");
  EXPECT(volmgr_metrics_text(vm, &out), VOLMGR_OK);
  CHECK(out != NULL && strstr(out, "storage_operation_duration_seconds_count{operation_name=\"volume_mount\"") != NULL,
        "metrics");
  volmgr_string_free(out);
  out = NULL;

  /* Misuse with a live handle: nothing written, clear errors. */
  EXPECT(volmgr_pod_upsert(vm, NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_pod_upsert(vm, "{not json"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_pod_upsert(vm, "\xfe\xff"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_pod_upsert(vm, make_pod("../escape", host, "Directory")), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(strstr(volmgr_last_error(), "invalid pod UID") != NULL, "uid message: %s", volmgr_last_error());
  EXPECT(volmgr_pod_delete(vm, "nobody"), VOLMGR_ERR_NOT_FOUND);
  EXPECT(volmgr_pod_delete(vm, "a/b"), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "nobody", 10), VOLMGR_ERR_NOT_FOUND);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, NULL, 10), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "pod-1", NULL), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_get_mounted_volumes_for_pod(NULL, "pod-1", &out), VOLMGR_ERR_INVALID_ARGUMENT);
  CHECK(out == NULL, "out untouched on failure");
  EXPECT(volmgr_volume_is_attached(vm, "x", NULL), VOLMGR_ERR_INVALID_ARGUMENT);

  /* A pod that cannot mount (type check fails): the wait times out. */
  snprintf(missing, sizeof missing, "%s/does-not-exist", host);
  EXPECT(volmgr_pod_upsert(vm, make_pod("pod-2", missing, "Directory")), VOLMGR_OK);
  EXPECT(volmgr_wait_for_attach_and_mount(vm, "pod-2", 300), VOLMGR_ERR_TIMEOUT);
  CHECK(strstr(volmgr_last_error(), "hostPath type check failed") != NULL, "timeout says why: %s", volmgr_last_error());

  host_plugin(vm, root);

  /* Tear down: both pods within one timeout. */
  EXPECT(volmgr_pod_delete(vm, "pod-1"), VOLMGR_OK);
  EXPECT(volmgr_pod_delete(vm, "pod-2"), VOLMGR_OK);
  EXPECT(volmgr_wait_for_all_pods_unmount(vm, NULL, 10), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_wait_for_all_pods_unmount(vm, "[\"pod-1\"", 10), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_wait_for_all_pods_unmount(vm, "[\"../x\"]", 10), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_wait_for_all_pods_unmount(NULL, "[]", 10), VOLMGR_ERR_INVALID_ARGUMENT);
  EXPECT(volmgr_wait_for_all_pods_unmount(vm, "[]", 10), VOLMGR_OK);
  EXPECT(volmgr_wait_for_all_pods_unmount(vm, "[\"pod-1\",\"pod-2\"]", 20000), VOLMGR_OK);
  EXPECT(volmgr_wait_for_unmount(vm, "pod-1", 20000), VOLMGR_OK);
  attached = true;
  EXPECT(volmgr_has_possibly_mounted_volumes_for_pod(vm, "pod-1", &attached), VOLMGR_OK);
  CHECK(!attached, "nothing possibly mounted after unmount");
  CHECK(mounted(path) == 0, "%s is unmounted", path);
  EXPECT(volmgr_get_mounted_volumes_for_pod(vm, "pod-1", &out), VOLMGR_OK);
  CHECK(out != NULL && strcmp(out, "[]") == 0, "no volumes left: %s", out ? out : "(null)");
  volmgr_string_free(out);
  out = NULL;
  CHECK(atomic_load(&events) >= 3, "events delivered: %d", atomic_load(&events));
  EXPECT(volmgr_set_event_callback(vm, NULL, NULL), VOLMGR_OK);
  EXPECT(volmgr_stop(vm), VOLMGR_OK);
  EXPECT(volmgr_stop(vm), VOLMGR_ERR_BUSY);
  volmgr_free(vm);

  /* The reported-in-use gate is a config key (CSI volumes, tested in Rust). */
  snprintf(config, sizeof config, "{\"root_dir\":\"%s\",\"tracer\":\"off\",\"wait_for_reported_in_use\":true}", root);
  vm = NULL;
  EXPECT(volmgr_new(config, &vm), VOLMGR_OK);
  EXPECT(volmgr_start(vm), VOLMGR_OK);
  volmgr_free(vm);

  projected(root);
  thread_safety(root, host);
  out_of_band(root, host, "mountinfo");
  out_of_band(root, host, "ebpf");

  printf("c flow: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
