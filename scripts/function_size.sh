#!/usr/bin/env bash
# Functions longer than the house limit (80 lines) in include/ and examples/, found by
# clang-tidy's readability-function-size (LineThreshold: the lines of the body, blank and comment
# lines included). It analyses every translation unit under examples/ and one generated unit that
# includes every public header, so that headers no example includes are checked too.
#
#   bash scripts/function_size.sh [BUILD_DIR]     (default: build)
#
# BUILD_DIR must hold compile_commands.json (the top-level CMakeLists.txt exports it). Prints one
# line per function, "path:line: function 'name' has N lines (limit 80)", and exits 1 if there is
# any, 2 if a unit does not compile under clang or a tool is missing, 0 otherwise.
# Environment: JOBS (parallel clang-tidy runs, default 2), LIMIT (default 80), CLANG_TIDY.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
jobs=${JOBS:-2}
limit=${LIMIT:-80}
tidy=${CLANG_TIDY:-$(command -v clang-tidy || command -v clang-tidy-14 || true)}
[ -n "$tidy" ] || { echo "function_size.sh: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 2; }
[ -f "$build/compile_commands.json" ] || {
  echo "function_size.sh: no $build/compile_commands.json; configure with CMake first" >&2
  exit 2
}

work="$build/function_size"
rm -rf "$work" && mkdir -p "$work"

# The units: every examples/ file once, and all_headers.cpp compiled like the translate example's
# distributed.cpp (attn, nlohmann_json and, when MPI was found, mpi.h on its include path).
python3 - "$root" "$build/compile_commands.json" "$work" <<'EOF'
import json, os, sys
root, db, work = sys.argv[1:]
entries, seen, template = [], set(), None
for e in json.load(open(db)):
    f = os.path.realpath(os.path.join(e["directory"], e["file"]))
    if f.endswith("examples/translate/distributed.cpp"):
        template = e
    if f.startswith(os.path.join(root, "examples") + os.sep) and f not in seen:
        seen.add(f)
        entries.append(e)
if template is None:
    sys.exit("function_size.sh: examples/translate/distributed.cpp is not in the compilation "
             "database; configure with -DATTN_BUILD_EXAMPLES=ON")
cmd = template.get("command") or " ".join(template["arguments"])
with_mpi = "-DATTN_TRANSLATE_WITH_MPI" in cmd
headers = []
for d, _, files in os.walk(os.path.join(root, "include", "attn")):
    if os.sep + "detail" in d:
        continue  # internal headers refuse direct inclusion; their parents include them
    for name in files:
        if name.endswith(".hpp") and (with_mpi or name not in ("data_parallel.hpp", "overlapped_sums.hpp",
                                                                  "ring_all_reduce.hpp", "replica_agreement.hpp")):
            headers.append(os.path.relpath(os.path.join(d, name), os.path.join(root, "include")))
unit = os.path.join(work, "all_headers.cpp")
with open(unit, "w") as out:
    out.writelines('#include "%s"\n' % h for h in sorted(headers))
src = os.path.realpath(os.path.join(template["directory"], template["file"]))
entries.append({"directory": template["directory"], "file": unit,
                "command": cmd.replace(src, unit).replace(template["file"], unit)})
json.dump(entries, open(os.path.join(work, "compile_commands.json"), "w"), indent=1)
with open(os.path.join(work, "units.txt"), "w") as out:
    out.writelines(e["file"] + "\n" for e in entries)
EOF

config="{Checks: '-*,readability-function-size', CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}"
export tidy config work root
# GCC 12 defaults to C++17 and CMake passes no -std for it; clang 14 would default to C++14.
# --system-headers: a GoogleTest TEST body is spelled inside gtest's macros, a system header, and
# would be dropped without it; --header-filter still keeps only our own files.
run_one() {
  local out
  out="$work/$(echo "$1" | tr '/' '_').log"
  if ! "$tidy" -p "$work" --quiet --system-headers --config="$config" \
      --header-filter="^$root/(include|examples)/" \
      --extra-arg=-std=c++17 --extra-arg=-Wno-unknown-warning-option "$1" >"$out" 2>&1; then
    echo "function_size.sh: clang-tidy failed on $1:" >&2
    grep -m 5 'error:' "$out" >&2 || tail -n 5 "$out" >&2
    return 1
  fi
}
export -f run_one
status=0
xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} <"$work/units.txt" || status=2

# A header's function is reported by every unit that includes it: once here. The note after each
# warning gives the count; a test is named by its TEST line, which follows the warning.
python3 - "$root" "$limit" "$work" <<'EOF' || { [ $status -eq 2 ] || status=1; }
import glob, os, re, sys
root, limit, work = sys.argv[1], sys.argv[2], sys.argv[3]
warn = re.compile(r"^(/\S+):(\d+):\d+: warning: function '(.*)' exceeds recommended size")
note = re.compile(r"note: (\d+) lines including whitespace and comments")
found = {}
for log in glob.glob(os.path.join(work, "*.log")):
    last, source_line_next = None, False
    for line in open(log, errors="replace"):
        m = warn.match(line)
        if m:
            last = (os.path.relpath(m.group(1), root), int(m.group(2)), m.group(3))
            source_line_next = m.group(3) == "TestBody"
            continue
        if source_line_next and last:
            last = (last[0], last[1], line.strip().rstrip("{").strip())
            source_line_next = False
            continue
        n = note.search(line)
        if n and last:
            found[last] = int(n.group(1))
            last = None
for (path, line, name), lines in sorted(found.items()):
    print("%s:%d: function '%s' has %d lines (limit %s)" % (path, line, name, lines, limit))
sys.exit(1 if found else 0)
EOF
exit $status
