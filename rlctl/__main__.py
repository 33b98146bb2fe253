from rlctl.entry import main

main()
