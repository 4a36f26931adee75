export * from "@runstate/client/langgraph";
