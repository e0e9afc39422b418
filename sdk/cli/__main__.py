from kvtier.cli.main import main

main()
