#!/bin/bash
# scripts/check_docs.py can fail: on pages in a scratch folder (outside the repository; their
# relative links resolve from there) it names the line of (a) an example whose output has one
# planted wrong character, in a fenced block and in an output region, and (b) a link to a missing
# page, a link to a missing heading and a named repository file that does not exist; (c) the
# correct page passes, and --update turns the planted page back into it. The examples are the
# README's fast ones (the bad.toml config error, `keys --policies`); their expected text is what
# the binary prints now, so only the planted character can differ.
#   tests/check_docs_plants.sh BINARY
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
binary=$(realpath "${1:?usage: tests/check_docs_plants.sh BINARY}")
check() {  # check [args...]: the checker's exit status; its output in $d/out
  python3 scripts/check_docs.py --binary "$binary" "$@" >"$d/out" 2>&1 && return 0 || return $?
}

# The examples' output, as the README's setup directive makes bad.toml.
mkdir "$d/run"
printf '[model]\nkind = "gpt"\nn_embd = 64\nn_head = 5\n' >"$d/run/bad.toml"
bad=$(cd "$d/run" && "$binary" --config bad.toml 2>&1) && fail "bad.toml did not fail: $bad"
policies=$("$binary" keys --policies)

# (c) The correct page: the examples, links to a heading of its own and of another page, an
# image, a URL (not followed), and a repository file it names.
mkdir "$d/pages"
cat >"$d/pages/other.md" <<'EOF'
# Other page

## A `heading`, with punctuation!
EOF
cat >"$d/pages/good.md" <<EOF
# Good page

<!-- readme-check: setup printf '[model]\nkind = "gpt"\nn_embd = 64\nn_head = 5\n' > bad.toml -->
\`\`\`
\$ remat-train --config bad.toml      # [model] kind = "gpt", n_embd = 64, n_head = 5
$bad
\`\`\`

<!-- readme-check: output remat-train keys --policies -->
$policies
<!-- readme-check: end -->

See [the heading](other.md#a-heading-with-punctuation), [the top](#good-page), ![a picture](other.md),
[a site](https://example.com/nowhere.md) and \`configs/mlp4.toml\`.
EOF
check "$d/pages/good.md" || fail "the correct page failed: $(cat "$d/out")"
grep -q "1 page(s): 2 example(s) checked, 0 differ; 0 broken" "$d/out" ||
  fail "the correct page's examples were not both checked: $(cat "$d/out")"

# (a) One character changed: a digit of the error line (line 6), and of the policies table's
# first row (line 12). The checker names both lines and shows the binary's text.
python3 - "$d/pages/good.md" "$d/pages/wrong.md" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
for n in (5, 11):  # 0-based: the error line, the first row of the table
    m = re.search(r"\d", lines[n])
    lines[n] = lines[n][:m.start()] + str((int(m.group()) + 1) % 10) + lines[n][m.end():]
open(sys.argv[2], "w").write("\n".join(lines))
EOF
check "$d/pages/wrong.md" && fail "a planted wrong figure passed: $(cat "$d/out")"
grep -q "FAIL $d/pages/wrong.md:5 \\$ remat-train --config bad.toml" "$d/out" ||
  fail "the planted error line was not named: $(cat "$d/out")"
grep -qF "binary: $bad" "$d/out" || fail "the binary's error line was not shown: $(cat "$d/out")"
grep -q "FAIL $d/pages/wrong.md:9 output of remat-train keys --policies" "$d/out" ||
  fail "the planted table row was not named: $(cat "$d/out")"
grep -q "2 example(s) checked, 2 differ" "$d/out" || fail "not both differ: $(cat "$d/out")"
check --links-only "$d/pages/wrong.md" || fail "--links-only ran the examples: $(cat "$d/out")"
check --update "$d/pages/wrong.md" || fail "--update failed: $(cat "$d/out")"
cmp -s "$d/pages/good.md" "$d/pages/wrong.md" ||
  fail "--update did not restore the page: $(diff "$d/pages/good.md" "$d/pages/wrong.md")"

# (b) A missing page, a missing heading, a missing repository file; a link and a name inside
# code (a span, a fenced block) are not checked.
cat >"$d/pages/links.md" <<'EOF'
# Links

See [the log](no-such-page.md) and
[a heading](other.md#no-such-heading), with `configs/no-such.toml`.
Not links: `[x](no-such-either.md)`, `run.jsonl`, `out/bad.toml`.

```
[y](no-such-in-a-block.md) `configs/no-such-in-a-block.toml`
```
EOF
check "$d/pages/links.md" && fail "broken links passed: $(cat "$d/out")"
for want in "$d/pages/links.md:3: broken link 'no-such-page.md' (no such file)" \
    "$d/pages/links.md:4: broken link 'other.md#no-such-heading' (no heading '#no-such-heading' in $d/pages/other.md)" \
    "$d/pages/links.md:4: names 'configs/no-such.toml' which does not exist" \
    "0 example(s) checked, 0 differ; 3 broken link(s) or missing file(s)"; do
  grep -qF "$want" "$d/out" || fail "not reported: $want; the output: $(cat "$d/out")"
done
check --links-only "$d/pages/links.md" && fail "--links-only passed broken links"
# (d) A tolerance directive: the error line's n_embd (token 6, 64) may differ by 2%, nothing else.
tol_page() {  # tol_page FILE N_EMBD N_HEAD: the error line with those figures, under the directive
  {
    printf '# Tolerance\n\n'
    printf '%s\n' "<!-- readme-check: setup printf '[model]\\nkind = \"gpt\"\\nn_embd = 64\\nn_head = 5\\n' > bad.toml -->"
    printf '%s\n' '<!-- readme-check: tolerance is\ not\ divisible 6 0.02 -->' '```' '$ remat-train --config bad.toml'
    echo "$bad" | sed "s/n_embd = 64/n_embd = $2/; s/n_head = 5\\./n_head = $3./"
    printf '%s\n' '```'
  } >"$1"
}
tol_page "$d/pages/tol-near.md" 65 5
check "$d/pages/tol-near.md" || fail "a figure within the tolerance failed: $(cat "$d/out")"
tol_page "$d/pages/tol-far.md" 70 5
check "$d/pages/tol-far.md" && fail "a figure 9% off passed a 2% tolerance: $(cat "$d/out")"
tol_page "$d/pages/tol-other.md" 64 6
check "$d/pages/tol-other.md" && fail "a token outside the tolerance's list passed: $(cat "$d/out")"
echo "check_docs: planted figures, links and files caught; the correct page passes; a tolerance lets its figures differ by its share, no more"
