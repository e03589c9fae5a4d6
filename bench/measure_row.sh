# Sourced by the sitting scripts: `measure NAME ARGS...` runs `draftzoo eval ARGS... ${common[@]}`
# into "$out/NAME" in its own process, unless that report exists (so a sitting resumes).
measure() {
    local name=$1
    shift
    if [ -f "$out/$name/report.json" ]; then
        echo "$name: $out/$name exists"
        return
    fi
    echo "== draftzoo eval $* ${common[*]}"
    draftzoo eval "$@" "${common[@]}" --output-dir "$out/$name"
}
