#!/usr/bin/env bash
# scripts/mutants.py check must fail on a stale mutant: a tree of one source file and two mutants,
# checked with both applying (exit 0), then with the line one of them plants its bug in changed
# (exit 1, the stale one named), then with a text that occurs twice (exit 1).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/src" "$root/tests/mutants"
printf 'int f(int a) {\n  return a + 1;\n}\nint g() { return 2; }\n' > "$root/src/f.cpp"
printf '# f adds 2\n@@ src/f.cpp\n-   return a + 1;\n+   return a + 2;\n' > "$root/tests/mutants/1-f-adds-two.mutant"
printf '# g returns 3\n@@ src/f.cpp\n- int g() { return 2; }\n+ int g() { return 3; }\n' > "$root/tests/mutants/2-g-three.mutant"
check() { python3 "$repo/scripts/mutants.py" check "$root"; }

out=$(check) || { echo "FAIL: two applying mutants were refused: $out"; exit 1; }
sed -i 's/a + 1/a + 1u/' "$root/src/f.cpp"
if out=$(check); then echo "FAIL: a stale mutant passed: $out"; exit 1; fi
grep -q "STALE 1-f-adds-two.mutant" <<<"$out" || { echo "FAIL: the stale mutant is not named: $out"; exit 1; }
sed -i 's/a + 1u/a + 1/' "$root/src/f.cpp"
printf 'int g() { return 2; }\n' >> "$root/src/f.cpp"
if out=$(check); then echo "FAIL: a text that occurs twice passed: $out"; exit 1; fi
grep -q "occurs 2 times" <<<"$out" || { echo "FAIL: the twice-found text is not reported: $out"; exit 1; }
echo "mutants check: applies, stale and ambiguous mutants told apart"
