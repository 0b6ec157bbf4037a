/*
 * hello-c: a minimal edgefn function written in C.
 *
 * Built as a wasm32-wasi *command* module (entry point `_start`) and run by
 * edgefn with its WAGI-style ABI:
 *   - the request arrives in environment variables (REQUEST_METHOD,
 *     PATH_INFO, QUERY_STRING, CONTENT_LENGTH, HTTP_<HEADER>, ...);
 *   - the request body arrives on stdin;
 *   - the response is written to stdout in CGI form: header lines, an
 *     empty line, then the body. stderr goes to the PoP's log.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returns getenv(name), or `fallback` when it is unset or empty. */
static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return (v != NULL && v[0] != '\0') ? v : fallback;
}

/*
 * Finds the value of the `name` parameter in a raw query string
 * ("a=1&name=Ada&b=2"). On success stores a pointer to the value and its
 * length (up to the next '&' or the end; not URL-decoded) and returns 1.
 */
static int find_name_param(const char *qs, const char **val, size_t *len)
{
    static const char key[] = "name=";
    const size_t keylen = sizeof(key) - 1;
    const char *p = qs;

    while (p != NULL && *p != '\0') {
        const char *amp = strchr(p, '&');
        size_t plen = amp != NULL ? (size_t)(amp - p) : strlen(p);

        if (plen >= keylen && strncmp(p, key, keylen) == 0) {
            *val = p + keylen;
            *len = plen - keylen;
            return 1;
        }
        p = amp != NULL ? amp + 1 : NULL;
    }
    return 0;
}

/* Reads stdin to EOF and returns the number of bytes read. */
static unsigned long long drain_stdin(void)
{
    unsigned char buf[4096];
    unsigned long long total = 0;
    size_t n;

    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0)
        total += n;
    if (ferror(stdin))
        fprintf(stderr, "hello-c: error reading request body\n");
    return total;
}

int main(void)
{
    const char *method = env_or("REQUEST_METHOD", "GET");
    const char *path = env_or("PATH_INFO", "/");
    const char *qs = env_or("QUERY_STRING", "");
    const char *name = NULL;
    size_t name_len = 0;
    /* Keep the echoed name bounded so a huge query cannot bloat the reply. */
    const size_t max_name = 256;

    /* Headers, then the blank line that ends them. */
    printf("Content-Type: text/plain; charset=utf-8\n");
    printf("X-Powered-By: edgefn-c\n");
    printf("\n");

    if (find_name_param(qs, &name, &name_len) && name_len > 0) {
        if (name_len > max_name)
            name_len = max_name;
        printf("Hello, %.*s from C! method=%s path=%s\n",
               (int)name_len, name, method, path);
    } else {
        printf("Hello from C! method=%s path=%s\n", method, path);
    }

    if (strcmp(method, "POST") == 0)
        printf("body-bytes=%llu\n", drain_stdin());

    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "hello-c: error writing response\n");
        return 1;
    }
    return 0;
}
