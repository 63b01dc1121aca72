/*
 * Runs a command as on a Linux 4.18 kernel (RHEL 8): the system calls added
 * since then fail with ENOSYS, through a seccomp filter inherited by the
 * command and everything it starts. The list is volmgr's
 * `sys::seccomp::NEWER_SYSCALLS` (numbers shared by every architecture).
 *   older_kernel COMMAND [ARG...]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "older_kernel: unknown architecture"
#endif

/* open_tree .. fspick (5.2), openat2 (5.6), mount_setattr (5.12),
 * fchmodat2 (6.6), statmount, listmount (6.8). */
static const unsigned newer[] = {428, 429, 430, 431, 432, 433, 437, 442, 452, 457, 458};
#define N (sizeof newer / sizeof newer[0])

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s COMMAND [ARG...]\n", argv[0]);
    return 2;
  }
  struct sock_filter filter[N + 6];
  size_t len = 0;
  filter[len++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  filter[len++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
  filter[len++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  filter[len++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  for (size_t i = 0; i < N; i++) {
    filter[len++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, newer[i], (unsigned char)(N - i), 0);
  }
  filter[len++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  filter[len++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
  struct sock_fprog prog = {.len = (unsigned short)len, .filter = filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
    perror("older_kernel: seccomp");
    return 1;
  }
  /* The filter is in place: openat2 must now fail with ENOSYS. */
  if (syscall(437, 0, 0, 0, 0) != -1 || errno != ENOSYS) {
    fprintf(stderr, "older_kernel: openat2 is not filtered\n");
    return 1;
  }
  execvp(argv[1], argv + 1);
  perror("older_kernel: exec");
  return 127;
}
