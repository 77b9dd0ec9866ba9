/* Tests for the error record and dtype table (include/dsv4/common.h). */
#include "dsv4/common.h"
#include "test.h"

int main(void) {
    dsv4_err e = {0};
    CHECK_EQ_INT(dsv4_err_set(&e, DSV4_EIO, "shard %s: truncated", "a.safetensors"), DSV4_EIO);
    CHECK_STR(e.msg, "shard a.safetensors: truncated");
    dsv4_err_prefix(&e, "loading %d: ", 3);
    CHECK_STR(e.msg, "loading 3: shard a.safetensors: truncated");
    dsv4_err_clear(&e);
    CHECK_EQ_INT(e.code, DSV4_OK);
    dsv4_err_prefix(&e, "ignored: ");
    CHECK_STR(e.msg, "");
    CHECK_EQ_INT(dsv4_err_set(NULL, DSV4_EINVAL, "x"), DSV4_EINVAL);

    const char *names[] = {"F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I32", "I64"};
    const size_t sizes[] = {4, 2, 2, 1, 1, 1, 1, 4, 8};
    for (int i = 0; i < 9; i++) {
        dsv4_dtype dt = dsv4_dtype_from_name(names[i]);
        CHECK(dt != DSV4_DT_INVALID);
        CHECK_STR(dsv4_dtype_name(dt), names[i]);
        CHECK_EQ_INT(dsv4_dtype_size(dt), sizes[i]);
    }
    CHECK_EQ_INT(dsv4_dtype_from_name("F8_E5M2"), DSV4_DT_INVALID);
    CHECK_EQ_INT(dsv4_dtype_from_name(NULL), DSV4_DT_INVALID);
    return TEST_REPORT();
}
