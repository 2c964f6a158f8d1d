from rack.cli import main

main()
