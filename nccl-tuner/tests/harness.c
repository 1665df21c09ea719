/* Loads the linkpilot tuner plugin as NCCL does and drives it from commands on stdin, one per
 * line; each answer ends with a line ".". The test (nccl.rs) adopts decisions through the gate,
 * as the training code does at a step boundary, and judges the answers.
 *
 * The declarations below are our own reading of NCCL 2.30's tuner interface (the facts in
 * docs: ncclTuner_v4/v5/v6_t, ncclTunerConstants_v5_t), written in C so that a layout mistake
 * on the Rust side shows up as a failed check or a wrong answer here.
 *
 *   abi                                   symbol lookup v6 -> v5 -> v4, sizes, shared members
 *   init VER COMMID NRANKS NNODES          -> "ctx SLOT rc RC net <21 NET latencies>"
 *   coll SLOT VER COLL NBYTES NCH T0..T20  -> "rc RC ch NCH table <21 costs>"
 *   chunk SLOT COLL NBYTES ALGO PROTO NCH CHUNK -> "rc RC chunk CHUNK"
 *   fin SLOT VER                           -> "rc RC"
 *   null SLOT                              bad arguments NCCL could pass -> "rcs ..."
 *   threads N SLOT                         N threads call getCollInfo + getChunkSize in a loop
 *   stop                                   -> "sig SIGNATURE COUNT"... "calls TOTAL"
 *   reload                                 dlclose and dlopen again, as NCCL does after the last
 *                                          communicator and before the next -> "reloaded VER"
 *   adopt ALGO PROTO CH STATE MIN CHUNK STEP  linkpilot_tuner_adopt -> "rc RC"
 *   withdraw                               linkpilot_tuner_adopt(NULL) -> "rc RC"
 *   badsize                                a decision whose size field says 40 -> "rc RC"
 *   forkchild SECONDS                      fork a child that sleeps, as a data loader's worker
 *                                          would be forked; answers once the child runs
 *                                          -> "child PID ready 1"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef int result_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

typedef struct {
  int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} nvl_info_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3]; /* NVLINK, PCI, NET */
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} constants_t;

typedef result_t (*init5_t)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, logger_t log,
                            nvl_info_t* nvl, constants_t* constants);
typedef result_t (*init4_t)(size_t nRanks, size_t nNodes, logger_t log, void** ctx);
typedef result_t (*coll_t)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                           int numProto, int regBuff, int* nChannels);
typedef result_t (*fin_t)(void* ctx);
typedef result_t (*chunk_t)(void* ctx, int collType, size_t nBytes, int algo, int proto, int nChannels,
                            size_t* chunkSize);

typedef struct {
  const char* name;
  init5_t init;
  coll_t getCollInfo;
  fin_t finalize;
  chunk_t getChunkSize;
} tuner6_t;
typedef struct {
  const char* name;
  init5_t init;
  coll_t getCollInfo;
  fin_t finalize;
} tuner5_t;
typedef struct {
  const char* name;
  init4_t init;
  coll_t getCollInfo;
  fin_t destroy;
} tuner4_t;

/* struct linkpilot_tuner_decision, as the README gives it to C callers. */
typedef struct {
  uint32_t size;
  uint8_t algo, proto, max_channels, state_index;
  uint64_t min_bytes, chunk_bytes, step;
} decision_t;
typedef int (*adopt_t)(const decision_t*);

_Static_assert(sizeof(decision_t) == 32 && offsetof(decision_t, min_bytes) == 8, "the gate's decision");
_Static_assert(sizeof(nvl_info_t) == 12, "nvlDomainInfo: three ints");
_Static_assert(sizeof(constants_t) == 1152, "tunerConstants: 144 doubles");
_Static_assert(offsetof(constants_t, hwLatencies) == 168, "hwLatencies after 7x3 base latencies");
_Static_assert(sizeof(tuner6_t) == 40 && offsetof(tuner6_t, getChunkSize) == 32, "v6: getChunkSize last");
_Static_assert(sizeof(tuner5_t) == 32 && sizeof(tuner4_t) == 32, "v5, v4: four members");

static const tuner6_t* v6;
static const tuner5_t* v5;
static const tuner4_t* v4;
static adopt_t adopt;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  (void)file;
  (void)line;
  pthread_mutex_lock(&out);
  printf("log %d %lu %s\n", level, flags, msg);
  pthread_mutex_unlock(&out);
}

static void answer(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&out);
  vprintf(fmt, ap);
  printf("\n");
  pthread_mutex_unlock(&out);
  va_end(ap);
}

static void done(void) { answer("."); }

/* The NET rows of NCCL 2.30's default hwLatencies (tuning.cc), the rest zero. */
static void default_constants(constants_t* c) {
  static const double net[7][3] = {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 31}, {0, 0, 30},
                                   {0, 0, 18},     {0, 0, 20.9},     {0, 0, 14}};
  memset(c, 0, sizeof *c);
  memcpy(c->hwLatencies[2], net, sizeof net);
}

/* The size of the exported object `name`, from the library's own symbol table. */
static size_t symbol_size(void* sym) {
  Dl_info info;
  const ElfW(Sym)* entry = NULL;
  if (!dladdr1(sym, &info, (void**)&entry, RTLD_DL_SYMENT) || entry == NULL) return 0;
  return entry->st_size;
}

static void* ctxs[64];
static int nctx;

static int cmd_abi(void) {
  if (!v6 || !v5 || !v4) {
    answer("error missing symbols: v6 %p v5 %p v4 %p", (void*)v6, (void*)v5, (void*)v4);
    return 0;
  }
  /* Members at the same place in every version must be the same functions: a member read at the
   * wrong offset would not be. */
  int same = v6->init == v5->init && v6->getCollInfo == v5->getCollInfo && v6->finalize == v5->finalize &&
             v4->getCollInfo == v5->getCollInfo && v4->destroy == v5->finalize && v6->getChunkSize != NULL &&
             v4->init != NULL && (void*)v4->init != (void*)v5->init;
  answer("abi name %s %s %s sizes %zu %zu %zu shared %s", v6->name, v5->name, v4->name, symbol_size((void*)v6),
         symbol_size((void*)v5), symbol_size((void*)v4), same ? "ok" : "WRONG");
  return 1;
}

static void print_doubles(char* buf, size_t n, const double* v, int count) {
  size_t at = 0;
  for (int i = 0; i < count && at < n; i++) at += snprintf(buf + at, n - at, " %g", v[i]);
}

static void print_floats(char* buf, size_t n, const float* v, int count) {
  size_t at = 0;
  for (int i = 0; i < count && at < n; i++) at += snprintf(buf + at, n - at, " %g", v[i]);
}

static void cmd_init(int ver, unsigned long long commId, size_t nRanks, size_t nNodes) {
  constants_t c;
  nvl_info_t nvl = {1, 8, 8};
  default_constants(&c);
  void* ctx = NULL;
  result_t rc;
  if (ver == 6) rc = v6->init(&ctx, commId, nRanks, nNodes, logger, &nvl, &c);
  else if (ver == 5) rc = v5->init(&ctx, commId, nRanks, nNodes, logger, &nvl, &c);
  else rc = v4->init(nRanks, nNodes, logger, &ctx);
  char buf[1024];
  print_doubles(buf, sizeof buf, &c.hwLatencies[2][0][0], 21);
  ctxs[nctx] = ctx;
  answer("ctx %d rc %d null %d net%s", nctx++, rc, ctx == NULL, buf);
}

static coll_t coll_of(int ver) { return ver == 6 ? v6->getCollInfo : ver == 5 ? v5->getCollInfo : v4->getCollInfo; }

static void cmd_coll(int slot, int ver, int coll, size_t nBytes, int nch, float* costs) {
  float table[7][3];
  memcpy(table, costs, sizeof table);
  result_t rc = coll_of(ver)(ctxs[slot], coll, nBytes, 1, (float**)table, 7, 3, 0, &nch);
  char buf[1024];
  print_floats(buf, sizeof buf, &table[0][0], 21);
  answer("rc %d ch %d table%s", rc, nch, buf);
}

static void cmd_chunk(int slot, int coll, size_t nBytes, int algo, int proto, int nch, size_t chunk) {
  result_t rc = v6->getChunkSize(ctxs[slot], coll, nBytes, algo, proto, nch, &chunk);
  answer("rc %d chunk %zu", rc, chunk);
}

static void cmd_null(int slot) {
  float table[7][3];
  for (int i = 0; i < 21; i++) (&table[0][0])[i] = 1.0f;
  int nch = 0;
  size_t chunk = 4096;
  void* ctx = ctxs[slot];
  int rcs[8] = {
      v6->getCollInfo(NULL, 4, 1 << 26, 1, (float**)table, 7, 3, 0, &nch),
      v6->getCollInfo(ctx, 4, 1 << 26, 1, NULL, 7, 3, 0, &nch),
      v6->getCollInfo(ctx, 4, 1 << 26, 1, (float**)table, 0, 3, 0, &nch),
      v6->getCollInfo(ctx, 4, 1 << 26, 1, (float**)table, 99, -3, 0, &nch),
      v6->getCollInfo(ctx, 4, 1 << 26, 1, (float**)table, 7, 3, 0, NULL),
      v6->getChunkSize(NULL, 4, 1 << 26, 1, 2, 4, &chunk),
      v6->getChunkSize(ctx, 4, 1 << 26, 1, 2, 4, NULL),
      v6->finalize(NULL),
  };
  int changed = 0;
  for (int i = 0; i < 21; i++) changed |= (&table[0][0])[i] != 1.0f && (&table[0][0])[i] != 0.0f;
  answer("rcs %d %d %d %d %d %d %d %d chunk %zu garbled %d", rcs[0], rcs[1], rcs[2], rcs[3], rcs[4], rcs[5], rcs[6],
         rcs[7], chunk, changed);
}

/* Threads: each getCollInfo outcome as "c:ZEROED-ENTRY:CHANNELS" (a torn board read would show
 * as a mix no board ever held) and each getChunkSize outcome as "k:CHUNK". */
#define MAX_SIGS 32
typedef struct {
  char sig[MAX_SIGS][48];
  unsigned long count[MAX_SIGS];
  int nsig;
  unsigned long overflow, calls, bad_rc;
  int started;
  pthread_t thread;
} worker_t;

static worker_t workers[64];
static int nworkers;
static volatile int stopping;
static void* worker_ctx;

static void* work(void* arg) {
  worker_t* w = arg;
  /* Multi-node AllReduce-like costs: Tree and Ring allowed, the rest not. */
  static const float base[21] = {30, 25, 20, 5, 15, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  while (!__atomic_load_n(&stopping, __ATOMIC_RELAXED)) {
    float table[7][3];
    memcpy(table, base, sizeof table);
    int nch = 0;
    size_t chunk = 4 << 20;
    result_t a = v6->getCollInfo(worker_ctx, 4, 64 << 20, 1, (float**)table, 7, 3, 0, &nch);
    result_t b = v6->getChunkSize(worker_ctx, 4, 64 << 20, 1, 2, 8, &chunk);
    if (a || b) w->bad_rc++;
    int zeroed = -1;
    for (int i = 0; i < 21; i++) {
      float v = (&table[0][0])[i];
      if (v != base[i]) zeroed = v == 0.0f && zeroed == -1 ? i : 99;
    }
    char sig[2][48];
    snprintf(sig[0], sizeof sig[0], "c:%d:%d", zeroed, nch);
    snprintf(sig[1], sizeof sig[1], "k:%zu", chunk);
    for (int k = 0; k < 2; k++) {
      int i = 0;
      while (i < w->nsig && strcmp(w->sig[i], sig[k])) i++;
      if (i == w->nsig) {
        if (w->nsig == MAX_SIGS) {
          w->overflow++;
          continue;
        }
        strcpy(w->sig[w->nsig++], sig[k]);
      }
      w->count[i]++;
    }
    w->calls++;
    __atomic_store_n(&w->started, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void cmd_threads(int n, int slot) {
  worker_ctx = ctxs[slot];
  stopping = 0;
  nworkers = n;
  for (int i = 0; i < n; i++) {
    memset(&workers[i], 0, sizeof workers[i]);
    pthread_create(&workers[i].thread, NULL, work, &workers[i]);
  }
  for (int i = 0; i < n; i++)
    while (!__atomic_load_n(&workers[i].started, __ATOMIC_ACQUIRE)) sched_yield();
  answer("started %d", n);
}

static void cmd_stop(void) {
  __atomic_store_n(&stopping, 1, __ATOMIC_RELAXED);
  char sig[MAX_SIGS * 2][48];
  unsigned long count[MAX_SIGS * 2], calls = 0, overflow = 0, bad = 0;
  int nsig = 0;
  for (int i = 0; i < nworkers; i++) {
    pthread_join(workers[i].thread, NULL);
    worker_t* w = &workers[i];
    calls += w->calls;
    overflow += w->overflow;
    bad += w->bad_rc;
    for (int s = 0; s < w->nsig; s++) {
      int j = 0;
      while (j < nsig && strcmp(sig[j], w->sig[s])) j++;
      if (j == nsig) {
        if (nsig == MAX_SIGS * 2) {
          overflow += w->count[s];
          continue;
        }
        strcpy(sig[nsig], w->sig[s]);
        count[nsig++] = 0;
      }
      count[j] += w->count[s];
    }
  }
  for (int j = 0; j < nsig; j++) answer("sig %s %lu", sig[j], count[j]);
  answer("calls %lu overflow %lu bad_rc %lu", calls, overflow, bad);
}

static void* lib;

/* As NCCL opens plugins. */
static int load(const char* path) {
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return 0;
  }
  /* NCCL tries v6, then v5, v4 (v3, v2) and takes the first it finds. */
  v6 = dlsym(lib, "ncclTunerPlugin_v6");
  v5 = dlsym(lib, "ncclTunerPlugin_v5");
  v4 = dlsym(lib, "ncclTunerPlugin_v4");
  adopt = (adopt_t)dlsym(lib, "linkpilot_tuner_adopt");
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: harness PLUGIN.so\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!load(argv[1])) return 1;
  answer("loaded %s", v6 ? "v6" : v5 ? "v5" : v4 ? "v4" : "none");
  done();
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    char cmd[16];
    int at = 0;
    if (sscanf(line, "%15s %n", cmd, &at) != 1) continue;
    const char* rest = line + at;
    if (!strcmp(cmd, "abi")) {
      cmd_abi();
    } else if (!strcmp(cmd, "init")) {
      int ver;
      unsigned long long id;
      size_t r, n;
      sscanf(rest, "%d %llu %zu %zu", &ver, &id, &r, &n);
      cmd_init(ver, id, r, n);
    } else if (!strcmp(cmd, "coll")) {
      int slot, ver, coll, nch, k;
      size_t bytes;
      float costs[21];
      sscanf(rest, "%d %d %d %zu %d %n", &slot, &ver, &coll, &bytes, &nch, &k);
      const char* p = rest + k;
      for (int i = 0; i < 21; i++) {
        char* end;
        costs[i] = strtof(p, &end);
        p = end;
      }
      cmd_coll(slot, ver, coll, bytes, nch, costs);
    } else if (!strcmp(cmd, "chunk")) {
      int slot, coll, algo, proto, nch;
      size_t bytes, chunk;
      sscanf(rest, "%d %d %zu %d %d %d %zu", &slot, &coll, &bytes, &algo, &proto, &nch, &chunk);
      cmd_chunk(slot, coll, bytes, algo, proto, nch, chunk);
    } else if (!strcmp(cmd, "fin")) {
      int slot, ver;
      sscanf(rest, "%d %d", &slot, &ver);
      fin_t fin = ver == 6 ? v6->finalize : ver == 5 ? v5->finalize : v4->destroy;
      answer("rc %d", fin(ctxs[slot]));
    } else if (!strcmp(cmd, "null")) {
      int slot;
      sscanf(rest, "%d", &slot);
      cmd_null(slot);
    } else if (!strcmp(cmd, "threads")) {
      int n, slot;
      sscanf(rest, "%d %d", &n, &slot);
      cmd_threads(n > 64 ? 64 : n, slot);
    } else if (!strcmp(cmd, "stop")) {
      cmd_stop();
    } else if (!strcmp(cmd, "adopt")) {
      unsigned algo, proto, ch, state;
      unsigned long long min, chunk, step;
      sscanf(rest, "%u %u %u %u %llu %llu %llu", &algo, &proto, &ch, &state, &min, &chunk, &step);
      decision_t d = {sizeof d, (uint8_t)algo, (uint8_t)proto, (uint8_t)ch, (uint8_t)state, min, chunk, step};
      answer("rc %d", adopt ? adopt(&d) : 99);
    } else if (!strcmp(cmd, "withdraw")) {
      answer("rc %d", adopt ? adopt(NULL) : 99);
    } else if (!strcmp(cmd, "forkchild")) {
      int secs = 0;
      sscanf(rest, "%d", &secs);
      /* The answer waits until the child runs: fork's atfork handlers have run in it by
       * then, so the test does not race the child's first instructions. */
      int ready[2];
      if (pipe(ready) != 0) {
        answer("error pipe");
        done();
        continue;
      }
      pid_t child = fork();
      if (child == 0) {
        close(ready[0]);
        (void)!write(ready[1], "r", 1);
        close(ready[1]);
        sleep((unsigned)secs);
        _exit(0);
      }
      close(ready[1]);
      char byte = 0;
      ssize_t got = child > 0 ? read(ready[0], &byte, 1) : -1;
      close(ready[0]);
      answer("child %d ready %d", (int)child, got == 1);
    } else if (!strcmp(cmd, "badsize")) {
      decision_t d = {40, 0, 2, 4, 1, 1 << 20, 2 << 20, 1};
      answer("rc %d", adopt ? adopt(&d) : 99);
    } else if (!strcmp(cmd, "reload")) {
      int closed = dlclose(lib);
      if (!load(argv[1])) return 1;
      nctx = 0;
      answer("reloaded %s dlclose %d", v6 ? "v6" : "none", closed);
    } else {
      answer("error unknown command %s", cmd);
    }
    done();
  }
  return 0;
}
