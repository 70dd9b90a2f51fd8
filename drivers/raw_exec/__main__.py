from drivers.raw_exec.main import main

main()
