# What both consumer projects build once they have attn (add_subdirectory/ or find_package/): the
# README's example against attn::attn, and checkpoint_consumer.cpp against attn::checkpoint, which
# brings nlohmann-json along; each run as a test.
add_executable(consumer ${ATTN_EXAMPLE_SOURCE})
target_link_libraries(consumer PRIVATE attn::attn)
add_executable(checkpoint_consumer ${ATTN_CHECKPOINT_EXAMPLE_SOURCE})
target_link_libraries(checkpoint_consumer PRIVATE attn::checkpoint)
enable_testing()
add_test(NAME consumer COMMAND consumer)
add_test(NAME checkpoint_consumer COMMAND checkpoint_consumer)
