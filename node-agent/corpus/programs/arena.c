/* glibc malloc under fragmentation, for the leak corpus (node-agent/corpus/README.md):
 * `threads` threads (one malloc arena each) keep a bounded live set of `live` bytes of
 * random sizes (16 B - 64 KiB), freeing and allocating at random. Resident memory grows
 * while the arenas fragment, then levels off: not a leak.
 *
 *   cc -O2 -pthread -o arena arena.c && ./arena [threads] [live MiB per thread]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t live_bytes;

static uint64_t next(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static void *work(void *arg) {
    uint64_t s = (uintptr_t)arg * 2654435761u + 1;
    enum { SLOTS = 4096 };
    static __thread void *slot[SLOTS];
    static __thread size_t len[SLOTS];
    size_t held = 0;
    for (;;) {
        for (int i = 0; i < 2000; i++) {
            size_t k = next(&s) % SLOTS;
            if (slot[k]) { held -= len[k]; free(slot[k]); slot[k] = 0; }
            if (held < live_bytes) {
                size_t n = 16 + next(&s) % (next(&s) % 8 == 0 ? 65536 : 512);
                slot[k] = malloc(n);
                memset(slot[k], 1, n);
                len[k] = n;
                held += n;
            }
        }
        usleep(20000);
    }
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    live_bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 16) << 20;
    pthread_t t;
    for (int i = 1; i < threads; i++) pthread_create(&t, 0, work, (void *)(uintptr_t)i);
    work(0);
}
