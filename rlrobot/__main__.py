from rlrobot.cli import main

main()
