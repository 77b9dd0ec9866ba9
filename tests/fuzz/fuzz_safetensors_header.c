/*
 * libFuzzer target: dsv4_st_parse on arbitrary bytes (the safetensors header
 * parser reads untrusted files). Build with -DDSV4_FUZZ=ON and clang; run
 *   ./build/fuzz_safetensors_header -max_total_time=60 tests/fuzz/corpus_safetensors
 * (To instrument the library too, configure a separate build:
 *   CC=clang cmake -S . -B build-fuzz -DDSV4_FUZZ=ON -DDSV4_CUDA=OFF \
 *     -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -O1" \
 *     -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
 *  and add -dict=tests/fuzz/safetensors.dict. 60 s here: 4.5M runs, no finding.)
 * Property checked beyond "no crash / no sanitizer report": every view of an
 * accepted file lies inside the input buffer and matches its dtype size.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_st_file *f = NULL;
    dsv4_err err = {0};
    if (dsv4_st_parse(data, size, "fuzz.safetensors", &f, &err) == 0) {
        for (size_t i = 0; i < dsv4_st_count(f); i++) {
            const dsv4_tview *v = dsv4_st_at(f, i);
            const uint8_t *p = v->data;
            if (p < data || p + v->nbytes > data + size) abort();
            if ((uint64_t)dsv4_tview_numel(v) * dsv4_dtype_size(v->dtype) != v->nbytes) abort();
        }
        dsv4_st_free(f);
    } else if (err.msg[0] == '\0') {
        abort(); /* every error carries a message */
    }
    return 0;
}
