live() { for p in $(pgrep -g "$1" 2>/dev/null); do s=$(sed -E 's/^.*\) //' /proc/$p/stat 2>/dev/null | cut -c1); [ -n "$s" ] && [ "$s" != Z ] && echo "$p"; done; return 0; }
echo "leader $(sed -E 's/^.*\) //' /proc/4242/stat 2>/dev/null | cut -d' ' -f1,20)"
echo "exit $(cat "$HOME"/.rlctl/jobs/demo/run/rollout-1.exit 2>/dev/null)"
echo "group $(live 4242 | tr "\n" " ")"
