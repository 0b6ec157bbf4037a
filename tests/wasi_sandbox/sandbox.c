// A WASI command that reports what the host lets it reach: its arguments, its
// environment, its file descriptors (preopened directories, sockets) and the
// files it can open or create. tests/test_wasi_sandbox.py runs it in a PoP;
// build.sh rebuilds sandbox.wasm.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wasi/api.h>

extern char **environ;

static const char *outcome(int fd) {
    if (fd < 0)
        return strerror(errno);
    close(fd);
    return "OPENED";
}

int main(int argc, char **argv) {
    printf("Content-Type: text/plain\n\n");
    for (int i = 0; i < argc; i++)
        printf("arg %s\n", argv[i]);
    for (char **e = environ; *e; e++)
        printf("env %s\n", *e);

    // Every descriptor the host handed over, and whether it is a preopened
    // directory (files) or accepts connections (network).
    for (__wasi_fd_t fd = 0; fd < 256; fd++) {
        __wasi_fdstat_t st;
        if (__wasi_fd_fdstat_get(fd, &st) == 0)
            printf("fd %u filetype %u\n", fd, st.fs_filetype);
        __wasi_prestat_t pre;
        if (__wasi_fd_prestat_get(fd, &pre) == 0)
            printf("preopen %u\n", fd);
        __wasi_fd_t conn;
        __wasi_errno_t err = __wasi_sock_accept(fd, 0, &conn);
        if (err == 0 || err == __WASI_ERRNO_AGAIN)
            printf("socket %u accepts\n", fd);
    }

    // PROBE_DIR (from the manifest's env) names a host folder holding secret.txt
    char secret[512], created[512];
    const char *dir = getenv("PROBE_DIR");
    snprintf(secret, sizeof secret, "%s/secret.txt", dir ? dir : "");
    snprintf(created, sizeof created, "%s/created-by-guest", dir ? dir : "");
    const char *reads[] = {"/", ".", "/etc/passwd", "/proc/self/environ", secret,
                           "edgefn.toml", "../edgefn.toml", NULL};
    for (const char **p = reads; *p; p++)
        printf("read %s: %s\n", *p, outcome(open(*p, O_RDONLY)));
    const char *writes[] = {created, "created-by-guest.txt", NULL};
    for (const char **p = writes; *p; p++)
        printf("create %s: %s\n", *p, outcome(open(*p, O_WRONLY | O_CREAT | O_TRUNC, 0644)));
    printf("end\n");
    return 0;
}
