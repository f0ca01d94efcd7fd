module github.com/ackwise/ackwise/bench

go 1.26

replace github.com/ackwise/ackwise => ../
