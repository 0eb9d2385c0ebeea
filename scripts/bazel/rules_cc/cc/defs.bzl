"""Offline stand-in for @rules_cc//cc:defs.bzl: Bazel 4's native C++ rules under rules_cc's names.

Bazel 4 loads @rules_cc while it resolves toolchains (its @bazel_tools//tools/cpp BUILD loads these
names), and would download rules_cc from GitHub; Debian's bazel-rules-cc (0.0.4) needs a newer
Bazel. TensorPipe builds no C++; these forward to the native rules Bazel 4 still has.
"""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)
