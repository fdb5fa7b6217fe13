from gpen_tune.cli import main

main()
