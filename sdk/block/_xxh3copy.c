/*
 * kvtier.block._xxh3copy: copy a payload and take its xxh3-64 in one pass.
 *
 * A read from a tier in this process (the host tier) is a copy of the stored
 * payload into the engine's buffer plus the checksum pass over it.  Done as
 * two passes (memcpy, then xxhash) the checksum costs 25-30% more than the
 * copy alone, as the data has left the core's caches by the time the hash
 * reads it.  Here every 64-byte stripe is hashed from the registers it was
 * copied through, so the check rides on the copy's memory traffic.
 *
 * Only the long-input form of XXH3-64 (inputs over 240 bytes) is written
 * here, from the algorithm as the xxHash specification (doc/xxhash_spec.md)
 * describes it; shorter inputs are left to the xxhash package, which is also
 * what the tests compare every result with.  A seed derives the secret as
 * the specification says.  The result is the hash as an int; the block
 * format stores it as 8 bytes big-endian.
 *
 * Two kernels: AVX2 when the CPU has it (chosen at import), else portable C.
 * Both copy and hash without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define KVTIER_X86 1
#include <immintrin.h>
#endif

#define STRIPE 64
#define SECRET_LEN 192
#define STRIPES_PER_BLOCK ((SECRET_LEN - STRIPE) / 8) /* 16 */
#define BLOCK_LEN (STRIPE * STRIPES_PER_BLOCK)        /* 1024 */
#define MIN_LEN 241                                   /* the long-input form */

static const uint64_t PRIME32_1 = 0x9E3779B1U;
static const uint64_t PRIME32_2 = 0x85EBCA77U;
static const uint64_t PRIME32_3 = 0xC2B2AE3DU;
static const uint64_t PRIME64_1 = 0x9E3779B185EBCA87ULL;
static const uint64_t PRIME64_2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t PRIME64_3 = 0x165667B19E3779F9ULL;
static const uint64_t PRIME64_4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t PRIME64_5 = 0x27D4EB2F165667C5ULL;
static const uint64_t PRIME_MX1 = 0x165667919E3779F9ULL;

/* The specification's default secret (192 bytes). */
static const uint8_t DEFAULT_SECRET[SECRET_LEN] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* Little-endian reads and writes; memcpy compiles to one move on any target. */
static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void write64(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

static void derive_secret(uint64_t seed, uint8_t secret[SECRET_LEN]) {
    for (int i = 0; i < SECRET_LEN / 16; i++) {
        write64(secret + 16 * i, read64(DEFAULT_SECRET + 16 * i) + seed);
        write64(secret + 16 * i + 8, read64(DEFAULT_SECRET + 16 * i + 8) - seed);
    }
}

static void scramble(uint64_t acc[8], const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(secret + SECRET_LEN - STRIPE + 8 * i);
        acc[i] = a * PRIME32_1;
    }
}

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
}

static uint64_t avalanche(uint64_t x) {
    x ^= x >> 37;
    x *= PRIME_MX1;
    x ^= x >> 32;
    return x;
}

static uint64_t merge(const uint64_t acc[8], const uint8_t *secret, size_t len) {
    uint64_t result = (uint64_t)len * PRIME64_1;
    for (int i = 0; i < 4; i++) {
        result += mul128_fold64(acc[2 * i] ^ read64(secret + 11 + 16 * i),
                                acc[2 * i + 1] ^ read64(secret + 11 + 16 * i + 8));
    }
    return avalanche(result);
}

/*
 * A kernel copies `stripes` stripes from src to dst (dst may be NULL: hash
 * only) and accumulates each, with the secret at 8 more bytes per stripe.
 */
typedef void (*kernel_fn)(uint64_t acc[8], const uint8_t *src, uint8_t *dst, size_t stripes,
                          const uint8_t *secret);

static void accumulate_portable(uint64_t acc[8], const uint8_t *src, uint8_t *dst,
                                size_t stripes, const uint8_t *secret) {
    for (size_t n = 0; n < stripes; n++) {
        const uint8_t *in = src + n * STRIPE;
        uint64_t lane[8];
        for (int i = 0; i < 8; i++) lane[i] = read64(in + 8 * i);
        if (dst) memcpy(dst + n * STRIPE, in, STRIPE);
        for (int i = 0; i < 8; i++) {
            uint64_t keyed = lane[i] ^ read64(secret + 8 * n + 8 * i);
            acc[i ^ 1] += lane[i];
            acc[i] += (keyed & 0xFFFFFFFFULL) * (keyed >> 32);
        }
    }
}

#ifdef KVTIER_X86
__attribute__((target("avx2"))) static void accumulate_avx2(uint64_t acc[8], const uint8_t *src,
                                                            uint8_t *dst, size_t stripes,
                                                            const uint8_t *secret) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)acc);
    __m256i hi = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (size_t n = 0; n < stripes; n++) {
        const uint8_t *in = src + n * STRIPE;
        __m256i d0 = _mm256_loadu_si256((const __m256i *)in);
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(in + 32));
        if (dst) {
            _mm256_storeu_si256((__m256i *)(dst + n * STRIPE), d0);
            _mm256_storeu_si256((__m256i *)(dst + n * STRIPE + 32), d1);
        }
        __m256i k0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)(secret + 8 * n)));
        __m256i k1 =
            _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(secret + 8 * n + 32)));
        /* lane i: low 32 bits times high 32 bits of (data ^ secret) ... */
        __m256i p0 = _mm256_mul_epu32(k0, _mm256_shuffle_epi32(k0, 0x31));
        __m256i p1 = _mm256_mul_epu32(k1, _mm256_shuffle_epi32(k1, 0x31));
        /* ... plus the data of lane i ^ 1 (the two 64-bit halves swapped) */
        lo = _mm256_add_epi64(lo, _mm256_add_epi64(p0, _mm256_shuffle_epi32(d0, 0x4E)));
        hi = _mm256_add_epi64(hi, _mm256_add_epi64(p1, _mm256_shuffle_epi32(d1, 0x4E)));
    }
    _mm256_storeu_si256((__m256i *)acc, lo);
    _mm256_storeu_si256((__m256i *)(acc + 4), hi);
}
#endif

static kernel_fn best_kernel = accumulate_portable;

/* XXH3-64 of src[0:len] (len >= MIN_LEN), copying it into dst unless NULL. */
static uint64_t copy_hash(const uint8_t *src, uint8_t *dst, size_t len, uint64_t seed,
                          kernel_fn kernel) {
    uint8_t derived[SECRET_LEN];
    const uint8_t *secret = DEFAULT_SECRET;
    if (seed) {
        derive_secret(seed, derived);
        secret = derived;
    }
    uint64_t acc[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3,
                       PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    /* whole blocks, leaving the last one (full or not) to the tail */
    size_t blocks = (len - 1) / BLOCK_LEN;
    for (size_t b = 0; b < blocks; b++) {
        size_t at = b * BLOCK_LEN;
        kernel(acc, src + at, dst ? dst + at : NULL, STRIPES_PER_BLOCK, secret);
        scramble(acc, secret);
    }
    size_t at = blocks * BLOCK_LEN;
    size_t stripes = (len - at - 1) / STRIPE;
    kernel(acc, src + at, dst ? dst + at : NULL, stripes, secret);
    at += stripes * STRIPE;
    if (dst) memcpy(dst + at, src + at, len - at);
    /* the last 64 bytes, which may overlap stripes already taken */
    kernel(acc, src + len - STRIPE, NULL, 1, secret + SECRET_LEN - STRIPE - 7);
    return merge(acc, secret, len);
}

static PyObject *run(PyObject *args, int copy, kernel_fn kernel) {
    Py_buffer src, dst;
    PyObject *seed_arg = NULL;
    int parsed = copy ? PyArg_ParseTuple(args, "y*w*|O!", &src, &dst, &PyLong_Type, &seed_arg)
                      : PyArg_ParseTuple(args, "y*|O!", &src, &PyLong_Type, &seed_arg);
    if (!parsed) return NULL;
    PyObject *result = NULL;
    /* a seed outside 0 .. 2**64-1 is an error, not a seed taken modulo 2**64 */
    unsigned long long seed = seed_arg ? PyLong_AsUnsignedLongLong(seed_arg) : 0;
    if (seed_arg && seed == (unsigned long long)-1 && PyErr_Occurred()) {
        /* OverflowError set */
    } else if (copy && dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "source is %zd bytes, destination %zd", src.len, dst.len);
    } else if (src.len < MIN_LEN) {
        PyErr_Format(PyExc_ValueError, "%zd bytes: only inputs of %d bytes or more", src.len,
                     MIN_LEN);
    } else {
        uint64_t hash;
        Py_BEGIN_ALLOW_THREADS
        hash = copy_hash((const uint8_t *)src.buf, copy ? (uint8_t *)dst.buf : NULL,
                         (size_t)src.len, (uint64_t)seed, kernel);
        Py_END_ALLOW_THREADS
        result = PyLong_FromUnsignedLongLong(hash);
    }
    PyBuffer_Release(&src);
    if (copy) PyBuffer_Release(&dst);
    return result;
}

static PyObject *copy_xxh3_64(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 1, best_kernel);
}

static PyObject *xxh3_64(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 0, best_kernel);
}

static PyObject *copy_xxh3_64_portable(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 1, accumulate_portable);
}

static PyMethodDef methods[] = {
    {"copy_xxh3_64", copy_xxh3_64, METH_VARARGS,
     "copy_xxh3_64(src, dst, seed=0) -> int\n\n"
     "Copy src into dst (same length, at least MIN_LEN bytes) and return\n"
     "the XXH3-64 of the bytes with this seed, in one pass."},
    {"xxh3_64", xxh3_64, METH_VARARGS,
     "xxh3_64(src, seed=0) -> int\n\nThe XXH3-64 of src (at least MIN_LEN bytes)."},
    {"copy_xxh3_64_portable", copy_xxh3_64_portable, METH_VARARGS,
     "copy_xxh3_64 with the portable kernel, whatever the CPU (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_xxh3copy",
    "Copy a payload and take its XXH3-64 in one pass.", -1, methods,
};

PyMODINIT_FUNC PyInit__xxh3copy(void) {
    const char *kernel_name = "portable";
#ifdef KVTIER_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        best_kernel = accumulate_avx2;
        kernel_name = "avx2";
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "MIN_LEN", MIN_LEN) < 0 ||
        PyModule_AddStringConstant(m, "KERNEL", kernel_name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
