from pa_oracle.cli import main

main()
