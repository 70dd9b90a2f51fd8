from drivers.exec.main import main

main()
