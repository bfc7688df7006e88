from charlm.cli import main

main()
